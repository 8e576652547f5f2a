"""Balancing strategies: pick one replica among those that can take a request now."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from switchyard.policy.schema import LoadSpec
from switchyard.pools.affinity import CacheAware
from switchyard.pools.least_load import LeastLoad
from switchyard.pools.replica import Replica


class Strategy(Protocol):
    def pick(self, candidates: Sequence[Replica], affinity: str | None = None) -> Replica:
        """One of `candidates` (never empty). `affinity` keys requests that share a KV-cache
        prefix (pools/affinity.py); strategies that do not place by it ignore it."""
        ...


class LeastInflight:
    """Fewest requests in flight (ours plus other gateways'); ties broken by EWMA latency, then in turn."""

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[Replica], affinity: str | None = None) -> Replica:
        if len(candidates) == 1:
            return candidates[0]
        self._turn += 1
        n = len(candidates)
        best = candidates[self._turn % n]
        best_key = (best.load, best.ewma_ms)
        for i in range(1, n):
            r = candidates[(self._turn + i) % n]
            key = (r.load, r.ewma_ms)
            if key < best_key:
                best, best_key = r, key
        return best


class PowerOfTwo:
    """Two random choices, the less loaded wins: near least-inflight without scanning the pool."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def pick(self, candidates: Sequence[Replica], affinity: str | None = None) -> Replica:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(range(len(candidates)), 2)
        ra, rb = candidates[a], candidates[b]
        return ra if (ra.load, ra.ewma_ms) <= (rb.load, rb.ewma_ms) else rb


class RoundRobin:
    """In turn, each replica `weight` times (smooth weighted round robin, as nginx does)."""

    def __init__(self, weights: dict[str, int] | None = None) -> None:
        self._weights = weights or {}
        self._current: dict[str, int] = {}

    def pick(self, candidates: Sequence[Replica], affinity: str | None = None) -> Replica:
        if len(candidates) == 1:
            return candidates[0]
        total = 0
        best: Replica | None = None
        for r in candidates:
            w = self._weights.get(r.url, 1)
            total += w
            cur = self._current.get(r.url, 0) + w
            self._current[r.url] = cur
            if best is None or cur > self._current[best.url]:
                best = r
        assert best is not None
        self._current[best.url] -= total
        return best


def make_strategy(name: str, weights: dict[str, int] | None = None, load: LoadSpec | None = None) -> Strategy:
    if name == "least_inflight":
        return LeastInflight()
    if name == "power_of_two":
        return PowerOfTwo()
    if name == "round_robin":
        return RoundRobin(weights)
    if name == "cache_aware":
        return CacheAware()
    if name == "least_load":
        return LeastLoad((load or LoadSpec()).stale)
    raise ValueError(f"unknown strategy {name!r}")
