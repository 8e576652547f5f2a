"""`strategy: least_load`: the replica whose engine holds the fewest requests, by its own metrics.

The gateway's in-flight counts see only the requests that went through the gateways; an
engine's metrics (pools/load.py) see every request it holds, those of direct clients, batch
jobs and other routers included, but only as of the last reading. The two are combined:

    requests = max(running + waiting + (in_flight_now - in_flight_when_read), in_flight_now)

the engine's count as read, moved by what the gateways sent or finished since (so a burst
between two readings spreads instead of piling onto the replica that looked idle), and never
below what the gateways alone have in flight there. KV-cache usage (0..1) is added: it
separates replicas within one request of each other (a fuller cache preempts or queues
sooner); then EWMA latency, then turns. A replica whose reading is older than `load.stale`
(or that never answered one) counts its in-flight requests alone, as least_inflight does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from switchyard.pools.replica import Replica


def load_score(r: Replica, now: float, stale: float) -> float:
    """How loaded `r` is: requests held (estimated), plus KV-cache usage as a fraction."""
    e = r.engine
    if e is None or now - e.at > stale:
        return float(r.load)
    requests = max(e.running + e.waiting + (r.load - e.base), float(r.load))
    return requests + (e.kv or 0.0)


class LeastLoad:
    def __init__(self, stale: float) -> None:
        self.stale = stale
        self._turn = 0

    def pick(self, candidates: Sequence[Replica], affinity: str | None = None) -> Replica:
        if len(candidates) == 1:
            return candidates[0]
        now = time.monotonic()
        self._turn += 1
        n = len(candidates)
        best = candidates[self._turn % n]
        best_key = (load_score(best, now, self.stale), best.ewma_ms)
        for i in range(1, n):
            r = candidates[(self._turn + i) % n]
            key = (load_score(r, now, self.stale), r.ewma_ms)
            if key < best_key:
                best, best_key = r, key
        return best
