"""The bottleneck capacity model: how much a routed cluster serves, against large-only.

A share f of requests goes to the large pool, the rest to the other pools. Each pool
serves at most (replicas x per-replica rate), so the cluster sustains
    X(f) = min(large capacity / f, small capacity / (1 - f))
requests per unit of `rate`. The baseline spends every node on large replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from switchyard.cluster.placement import Plan


class CapacityError(ValueError):
    pass


@dataclass(frozen=True)
class Capacity:
    large_pool: str
    small_pools: tuple[str, ...]
    large_rate: float
    large_replicas: int
    large_cap: float
    small_cap: float
    small_detail: str
    baseline_replicas: int
    baseline_cap: float

    def routed(self, f: float) -> float:
        """Sustained throughput when a share f (0..1) of requests needs the large pool."""
        if not 0.0 <= f <= 1.0:
            raise CapacityError(f"the large share f must be between 0 and 1, got {f}")
        large = math.inf if f == 0 else self.large_cap / f
        small = math.inf if f == 1 else (self.small_cap / (1 - f) if self.small_cap > 0 else 0.0)
        return min(large, small)

    def speedup(self, f: float) -> float:
        return self.routed(f) / self.baseline_cap

    def bottleneck(self, f: float) -> str:
        large = math.inf if f == 0 else self.large_cap / f
        small = math.inf if f == 1 else (self.small_cap / (1 - f) if self.small_cap > 0 else 0.0)
        return "large" if large <= small else "small"


def pick_large_pool(plan: Plan, name: str | None = None) -> str:
    """The pool named, else the widest replica (TP ranks), then the biggest model, then file order."""
    pools = plan.policy.pools
    if name is not None:
        if name not in pools:
            raise CapacityError(f"--large {name!r}: no such pool; pools are {sorted(pools)}")
        return name
    order = list(pools)
    return max(
        order,
        key=lambda p: (
            pools[p].nodes_per_replica * pools[p].ranks_per_node,
            plan.sized.get(p, 0.0),
            -order.index(p),
        ),
    )


def capacity(plan: Plan, large: str | None = None) -> Capacity:
    """Capacities of the planned layout; every pool needs its per-replica `rate`."""
    pools = plan.policy.pools
    large = pick_large_pool(plan, large)
    missing = [p for p, spec in pools.items() if spec.rate is None]
    if missing:
        raise CapacityError(
            f"no capacity model: pool(s) {', '.join(missing)} have no `rate` (per-replica throughput, "
            f"measured or expected); add it to the policy"
        )
    count = {p: len(plan.pool_replicas(p)) for p in pools}
    small = tuple(p for p in pools if p != large)
    lrate = float(pools[large].rate or 0.0)
    width = pools[large].nodes_per_replica
    baseline = len(plan.cluster.nodes) // width
    if baseline == 0:
        raise CapacityError(f"no baseline: one {large} replica needs {width} nodes")
    return Capacity(
        large_pool=large,
        small_pools=small,
        large_rate=lrate,
        large_replicas=count[large],
        large_cap=count[large] * lrate,
        small_cap=sum(count[p] * float(pools[p].rate or 0.0) for p in small),
        small_detail=" + ".join(f"{count[p]} x {pools[p].rate:g}" for p in small) or "none",
        baseline_replicas=baseline,
        baseline_cap=baseline * lrate,
    )


def fmt_ratio(x: float) -> str:
    """1.5 -> '1.5x', 3.0 -> '3.0x', 2.6667 -> '2.67x': exact figures print exactly."""
    s = f"{x:.2f}"
    if s.endswith("0"):
        s = s[:-1]
    return s + "x"
