"""Helpers for the cluster tests: cluster files and planning policies from a few fields."""

from __future__ import annotations

from pathlib import Path

import yaml

from switchyard.cluster.placement import Plan, plan_cluster
from switchyard.cluster.topology import Cluster, parse_cluster
from switchyard.policy.loader import parse_policy
from switchyard.policy.schema import PolicySpec

ROOT = Path(__file__).resolve().parents[2]


def make_cluster(n: int, fabric: str = "switch", memory_gb: float = 128, **extra: object) -> Cluster:
    data = {
        "name": f"{fabric}{n}",
        "fabric": fabric,
        "memory_gb": memory_gb,
        "nodes": [{"name": f"n{i}", "address": f"10.1.0.{i}"} for i in range(1, n + 1)],
        **extra,
    }
    return parse_cluster(yaml.safe_dump(data), "test-cluster.yaml")


def make_policy(**pools: dict) -> PolicySpec:
    """pools: name -> pool fields; `model` defaults to the name, `replicas` to 1."""
    spec = {name: {"model": name, "replicas": 1, **fields} for name, fields in pools.items()}
    first = next(iter(pools))
    data = {"version": 1, "name": "test", "pools": spec, "routes": [{"name": "default", "pool": first}]}
    return parse_policy(yaml.safe_dump(data), "test-policy.yaml")


def plan_of(cluster: Cluster, policy: PolicySpec, base: Path | None = None) -> Plan:
    return plan_cluster(cluster, policy, base)
