"""The background sync between this gateway's replicas and the shared store.

Every `interval` (50 ms) one call to StateStore.sync publishes this gateway's in-flight
counts, counter deltas and new readings of replicas' own load, and reads the other gateways'
view, which is then applied to the Replica objects: remote_inflight (least_inflight balances
across gateways), circuits opened elsewhere (force_open), drains started elsewhere, newer load
readings (least_load; the poller then skips a replica read elsewhere a moment ago). Nothing
here runs on the request path.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from switchyard.pools.pool import ReplicaRegistry
from switchyard.pools.replica import EngineLoad, Replica
from switchyard.state.base import CounterDelta, LoadRecord, SharedView, StateStore

log = logging.getLogger("switchyard.pools.sync")


class CounterSource(Protocol):
    """Something that keeps counters in shared windows (gateway/limits.RateLimiter)."""

    def take_deltas(self) -> tuple[list[CounterDelta], list[str]]:
        """What to add, and which buckets to read back."""
        ...

    def apply_totals(self, deltas: list[CounterDelta], totals: dict[str, dict[str, int]] | None) -> None:
        """Shared totals per bucket and field; None: the sync failed (or nothing is shared), keep the deltas."""
        ...


class StateSync:
    def __init__(self, registry: ReplicaRegistry, state: StateStore, interval: float = 0.05):
        self.registry = registry
        self.state = state
        self.interval = interval
        self.sources: list[CounterSource] = []
        self.generation = 0  # completed ticks
        self.last_ok: float = 0.0
        self._task: asyncio.Task | None = None
        self._local_drain: dict[str, int] = {}  # url -> generation when this gateway changed its drain state
        self._remote_zeroed = True
        self._published: dict[str, float] = {}  # url -> time of the last load reading published
        self._rank, self._gateways = 0, 1  # this gateway among the live ones, as of the last sync

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self.state.shared:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="state-sync")

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # a bug here must not stop sharing for good
                log.exception("state sync failed")
            await asyncio.sleep(self.interval)

    async def tick(self) -> None:
        inflight = {url: r.inflight for url, r in self.registry.by_url.items() if r.inflight > 0}
        per_source = [(s, *s.take_deltas()) for s in self.sources]
        deltas = [d for _, ds, _ in per_source for d in ds]
        buckets = [b for _, _, bs in per_source for b in bs]
        loads = self._new_loads()
        view = await self.state.sync(inflight, deltas, buckets, loads)
        for src, ds, _ in per_source:
            src.apply_totals(ds, None if view is None else view.counters)
        if view is None:
            self._rank, self._gateways = 0, 1  # alone as far as it knows: it reads every replica itself
            if not self._remote_zeroed:  # shared store away: local counts are all we know
                for r in self.registry.by_url.values():
                    self._set_remote(r, 0)
                self._remote_zeroed = True
        else:
            self.apply(view)
            self._rank, self._gateways = view.rank, max(1, view.gateways)
            self._remote_zeroed = False
            self.last_ok = time.time()
        self.generation += 1

    def owns(self, url: str) -> bool:
        """Whether this gateway reads the replica's metrics (least_load): one gateway per replica,
        by a hash of its URL over the live gateways; every gateway agrees without a word."""
        return self._gateways <= 1 or zlib.crc32(url.encode()) % self._gateways == self._rank

    def _new_loads(self) -> dict[str, LoadRecord]:
        """Load readings this gateway took since the last tick (pools/load.py), for the others."""
        now = time.monotonic()
        out = {}
        for url, r in self.registry.by_url.items():
            e = r.engine
            if e is not None and not e.shared and self._published.get(url) != e.at:
                self._published[url] = e.at
                out[url] = LoadRecord(e.running, e.waiting, e.kv, e.base, now - e.at)
        return out

    def _set_remote(self, r: Replica, n: int) -> None:
        freed = r.remote_inflight - n
        r.remote_inflight = n
        if freed > 0:  # slots freed elsewhere: let requests queued here try again
            for pool in r.pools:
                for _ in range(min(freed, len(pool.waiters))):
                    pool.wake_one()

    def apply(self, view: SharedView) -> None:
        now, wall = time.monotonic(), time.time()
        for url, r in self.registry.by_url.items():
            self._set_remote(r, view.inflight.get(url, 0))
            rec = view.loads.get(url)
            if rec is not None:
                at = now - rec.age
                if r.engine is None or at > r.engine.at + 0.001:  # newer than what this gateway holds
                    r.engine = EngineLoad(rec.running, rec.waiting, rec.kv, rec.base, at, shared=True)
            c = view.circuits.get(url)
            if c is not None:
                until = now + (c.until - wall)
                br = r.breaker
                local_until = br.opened_at + br.cooldown if br.state == "open" else 0.0
                if until > local_until + 0.05:
                    if br.state == "closed":
                        log.warning("replica %s ejected by another gateway: %s", r.name, c.reason)
                    br.force_open(until, c.reason, now)
            if self._local_drain.get(url, -10) >= self.generation - 1:
                continue  # changed here a moment ago: the store may not reflect it in this view yet
            d = view.drains.get(url)
            r.draining = d is not None
            r.drained = d == "drained"

    # --- replica drain (admin API) ----------------------------------------------------------

    async def drain(self, r: Replica, timeout: float) -> bool:
        """No new requests to `r`; wait until no gateway has one in flight there; then mark it drained."""
        r.draining, r.drained = True, False
        self._local_drain[r.url] = self.generation
        await self.state.put_drain(r.url, "draining")
        start = self.generation
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            # Remote counts are fresh only after a tick that began after the drain was published.
            fresh = not self.running or self.generation >= start + 2
            if fresh and r.inflight + r.remote_inflight == 0:
                r.drained = True
                self._local_drain[r.url] = self.generation
                await self.state.put_drain(r.url, "drained")
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)

    async def undrain(self, r: Replica) -> None:
        r.draining = r.drained = False
        self._local_drain[r.url] = self.generation
        await self.state.put_drain(r.url, None)

    def collector(self) -> Collector:
        """Prometheus gauges of the shared state, read at scrape time."""
        return _SyncCollector(self)

    def describe(self) -> dict:
        return {"interval_s": self.interval, "running": self.running, "ticks": self.generation,
                "last_ok_s_ago": round(time.time() - self.last_ok, 3) if self.last_ok else None}

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass


class _SyncCollector(Collector):
    def __init__(self, sync: StateSync):
        self.sync = sync

    def collect(self):
        d = self.sync.state.describe()
        kind = d.get("kind", "?")
        gws = GaugeMetricFamily("switchyard_state_gateways", "Live gateways sharing the state store (this one included)",
                                labels=["kind"])
        gws.add_metric([kind], float(d.get("gateways", 1)))
        outages = GaugeMetricFamily("switchyard_state_outages", "Times the shared store became unreachable",
                                    labels=["kind"])
        outages.add_metric([kind], float(d.get("outages", 0)))
        late = GaugeMetricFamily("switchyard_state_late_flushes",
                                 "Responses sent before their session writes reached the shared store",
                                 labels=["kind"])
        late.add_metric([kind], float(d.get("late_flushes", 0)))
        age = GaugeMetricFamily("switchyard_state_sync_age_seconds",
                                "Seconds since the last successful sync with the shared store (-1: never)", labels=["kind"])
        age.add_metric([kind], time.time() - self.sync.last_ok if self.sync.last_ok else -1.0)
        remote = GaugeMetricFamily("switchyard_remote_inflight", "Requests in flight through other gateways",
                                   labels=["replica"])
        for r in self.sync.registry.by_url.values():
            remote.add_metric([r.name], float(r.remote_inflight))
        yield from (gws, outages, late, age, remote)
