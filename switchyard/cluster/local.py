"""The one-node "local" plan behind `switchyard up`: same planner, replicas share this machine."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from switchyard.cluster.launch import engine_serve
from switchyard.cluster.placement import Plan, PlanError, plan_cluster
from switchyard.cluster.topology import local_cluster
from switchyard.policy.schema import PolicySpec


@dataclass(frozen=True)
class LocalLaunch:
    pool: str
    replica: str
    host: str
    port: int
    url: str
    command: list[str] | None  # None: no `engine:` section, or another runtime than ours: nothing to start


def _memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):  # not a POSIX sysconf: do not check
        return 1e6


def _gpus() -> int:
    # Only asked when a pool runs on cuda; torch is the engine's dependency, not the gateway's.
    try:
        import torch

        return max(torch.cuda.device_count(), 1)
    except ImportError:
        return 1


def plan_local(policy: PolicySpec, base: Path | None = None) -> Plan:
    """Plan every pool's replicas on 127.0.0.1, each on the port of its URL in the policy.

    The node is this machine: its RAM, its GPUs (when a pool runs on cuda); replicas share it.
    Pools whose `replicas` is a count get ports from 8000 up. Raises PlanError like a cluster plan.
    """
    cuda = any(p.engine is not None and p.engine.device == "cuda" for p in policy.pools.values())
    cluster = local_cluster(memory_gb=_memory_gb(), device="cuda" if cuda else "cpu")
    if cuda:
        cluster = cluster.model_copy(update={"gpus": _gpus()})
    return plan_cluster(cluster, policy, base)


def local_launches(policy: PolicySpec, base: Path | None = None, python: str | None = None) -> list[LocalLaunch]:
    """For `switchyard up`: each replica's address and the command that starts it."""
    plan = plan_local(policy, base)
    py = python or sys.executable
    out = []
    for rep in plan.replicas:
        pool = policy.pools[rep.pool]
        cmd = None
        # `up` starts our engine; a pool on another runtime is expected to be running already.
        if pool.engine is not None and pool.engine.runtime == "switchyard":
            # `engine serve --tp N` supervises its ranks itself (not torchrun): on Ctrl-C it asks
            # rank 0 to stop, which stops the others in order, so a shutdown logs as one.
            cmd = engine_serve(rep, "127.0.0.1", py)
        out.append(LocalLaunch(rep.pool, rep.name, "127.0.0.1", rep.port, f"http://127.0.0.1:{rep.port}/v1", cmd))
    return out


__all__ = ["LocalLaunch", "PlanError", "local_launches", "plan_local"]
