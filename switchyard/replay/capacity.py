"""The cluster throughput a routing split buys: a call into the cluster capacity model.

The capacity model belongs to switchyard.cluster (routed throughput =
min(large capacity / f, small capacity / (1 - f)), relative to all-large). Until that
module is present, replay reports the ratio as unavailable and says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cluster_throughput(cluster_file: str | Path, policy_file: str | Path | None, large_share: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"cluster": str(cluster_file), "large_share": large_share, "ratio": None}
    if large_share is None:
        out["note"] = "no routing split to evaluate"
        return out
    try:
        from switchyard.cluster import capacity  # type: ignore[attr-defined]
    except ImportError:
        out["note"] = "cluster capacity model not available (switchyard.cluster.capacity)"
        return out
    fn = getattr(capacity, "throughput_for_split", None)
    if fn is None:
        out["note"] = "switchyard.cluster.capacity has no throughput_for_split()"
        return out
    try:
        out.update(fn(cluster_file, policy_file, large_share))
    except Exception as e:  # a cluster file the model rejects must not lose the replay's report
        out["note"] = f"capacity model: {e}"
    return out
