"""Discrete-event simulation of the routed cluster under Poisson arrivals.

Each request goes to the large pool with probability f, else to a small pool (in
proportion to capacity). Each pool is the gateway's queue in front of its replicas: a
FIFO queue feeding `replicas` servers, each serving one request at a time with
exponential service times of mean 1/rate (an M/M/c queue per pool). Seeded numpy, so
the same arguments give the same numbers.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from switchyard.cluster.capacity import Capacity
from switchyard.cluster.placement import Plan


@dataclass(frozen=True)
class PoolLoad:
    name: str
    replicas: int
    rate: float  # per replica, requests per second
    share: float  # of all requests


@dataclass(frozen=True)
class PoolResult:
    name: str
    share: float
    capacity: float
    throughput: float
    utilization: float
    p50: float
    p99: float


@dataclass(frozen=True)
class SimResult:
    load: float
    requests: int
    window_s: float
    throughput: float  # completions per second in the measured window
    sustained: float  # largest total rate whose split the pools kept up with: min(pool rate / share)
    p50: float
    p99: float
    pools: tuple[PoolResult, ...]


def pool_loads(plan: Plan, cap: Capacity, f: float) -> list[PoolLoad]:
    pools = plan.policy.pools
    out = [PoolLoad(cap.large_pool, cap.large_replicas, cap.large_rate, f)]
    for name in cap.small_pools:
        n, rate = len(plan.pool_replicas(name)), float(pools[name].rate or 0.0)
        share = (1 - f) * (n * rate / cap.small_cap) if cap.small_cap > 0 else 0.0
        out.append(PoolLoad(name, n, rate, share))
    return out


def _mmc(arrivals: np.ndarray, service: np.ndarray, servers: int) -> np.ndarray:
    """Finish time of each request (arrivals sorted) on `servers` FIFO servers."""
    free = [0.0] * servers
    end = np.empty_like(arrivals)
    for i, (t, s) in enumerate(zip(arrivals.tolist(), service.tolist(), strict=True)):
        start = max(t, heapq.heappop(free))
        end[i] = start + s
        heapq.heappush(free, end[i])
    return end


def simulate(pools: list[PoolLoad], load: float, requests: int = 200_000, seed: int = 0, warmup: float = 0.1) -> SimResult:
    """Offer `load` requests/s for `requests` arrivals; measure after the first `warmup` share of time."""
    if load <= 0:
        raise ValueError("the simulated load must be > 0 requests/s")
    shares = np.array([p.share for p in pools], dtype=float)
    if shares.sum() <= 0:
        raise ValueError("no pool gets any traffic")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / load, size=requests))
    horizon = float(arrivals[-1])
    t0 = warmup * horizon
    window = horizon - t0
    which = rng.choice(len(pools), size=requests, p=shares / shares.sum())
    results, lat_all, done_all = [], [], 0
    for k, p in enumerate(pools):
        arr = arrivals[which == k]
        if p.replicas == 0 or p.rate <= 0 or arr.size == 0:
            results.append(PoolResult(p.name, p.share, p.replicas * p.rate, 0.0, 0.0, np.nan, np.nan))
            continue
        service = rng.exponential(1.0 / p.rate, size=arr.size)
        end = _mmc(arr, service, p.replicas)
        done = int(np.count_nonzero((end >= t0) & (end <= horizon)))
        # Busy time inside the window, for utilization.
        busy = float(np.sum(np.clip(np.minimum(end, horizon) - np.maximum(end - service, t0), 0, None)))
        lat = (end - arr)[arr >= t0]
        lat_all.append(lat)
        done_all += done
        results.append(
            PoolResult(
                name=p.name,
                share=p.share,
                capacity=p.replicas * p.rate,
                throughput=done / window,
                utilization=busy / (window * p.replicas),
                p50=float(np.percentile(lat, 50)) if lat.size else np.nan,
                p99=float(np.percentile(lat, 99)) if lat.size else np.nan,
            )
        )
    lat = np.concatenate(lat_all) if lat_all else np.array([np.nan])
    sustained = min(r.throughput / r.share for r in results if r.share > 0)
    return SimResult(
        load=load,
        requests=requests,
        window_s=window,
        throughput=done_all / window,
        sustained=sustained,
        p50=float(np.percentile(lat, 50)),
        p99=float(np.percentile(lat, 99)),
        pools=tuple(results),
    )
