"""The cluster throughput a routing split buys, from switchyard.cluster's capacity model.

routed throughput = min(large capacity / f, small capacity / (1 - f)), relative to the
same cluster spent on large replicas only. The pools' replica counts, widths and rates
come from a planning policy: the replayed policy itself, or `--plan-policy FILE` when the
replayed one names replica URLs without rates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cluster_throughput(
    cluster_file: str | Path,
    policy_file: str | Path | None,
    large_share: float | None,
    large_pool: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"cluster": str(cluster_file), "large_share": large_share, "ratio": None}
    if large_share is None:
        out["note"] = "no routing split to evaluate"
        return out
    if policy_file is None:
        out["note"] = "needs a policy (pools with rates) for the capacity model"
        return out
    try:
        from switchyard.cluster.capacity import CapacityError, capacity
        from switchyard.cluster.placement import PlanError, plan_cluster
        from switchyard.cluster.topology import ClusterError, load_cluster
    except ImportError as e:
        out["note"] = f"cluster capacity model not available: {e}"
        return out
    from switchyard.policy.loader import PolicyError, load_policy

    try:
        spec = load_policy(policy_file)
        plan = plan_cluster(load_cluster(cluster_file), spec, Path(policy_file).resolve().parent)
        large = large_pool if large_pool in spec.pools else None
        cap = capacity(plan, large)
        out.update(
            ratio=round(cap.speedup(large_share), 4),
            large_pool=cap.large_pool,
            bottleneck=cap.bottleneck(large_share),
            routed=cap.routed(large_share),
            baseline=cap.baseline_cap,
            plan_policy=str(policy_file),
        )
    except PlanError as e:
        out["note"] = "cannot place the policy on the cluster: " + "; ".join(getattr(e, "issues", [str(e)]))
    except (CapacityError, ClusterError, PolicyError) as e:
        out["note"] = str(e).replace("\n", "; ")
    return out
