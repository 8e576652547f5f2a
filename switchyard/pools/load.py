"""What a replica's engine says of its own load, read from its Prometheus /metrics.

vLLM, SGLang and llama.cpp's server publish how many requests they run and queue and how full
their KV cache is; our engine uses vLLM's names, so the gateway reads them all alike:

    running              waiting                  KV cache (0..1)
    vllm:num_requests_running   vllm:num_requests_waiting   vllm:kv_cache_usage_perc (older: gpu_cache_usage_perc)
    sglang:num_running_reqs     sglang:num_queue_reqs       sglang:token_usage
    llamacpp:requests_processing llamacpp:requests_deferred llamacpp:kv_cache_usage_ratio

Label sets (data-parallel engines, several models) are summed (KV usage: averaged). One loop
polls the replicas of the `least_load` pools every `load.interval`. With Redis, each replica is
read by one gateway (a hash of its URL over the live gateways, pools/sync.StateSync.owns) and
the reading shared with the others, so a replica is scraped once an interval whatever the
number of gateways; when its reader's readings stop coming (that gateway died), the others
read it themselves after two intervals. Nothing here runs on the request path.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from switchyard.policy.schema import LoadSpec
from switchyard.pools.replica import EngineLoad, Replica

log = logging.getLogger("switchyard.pools.load")

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
      "llamacpp:kv_cache_usage_ratio")
_WANTED = RUNNING + WAITING + KV
MAX_METRICS_BYTES = 4 * 1024 * 1024  # vLLM's page is tens of KB; anything near this is not metrics


@dataclass(frozen=True, slots=True)
class Counts:
    running: float
    waiting: float
    kv: float | None


def parse_metrics(text: str) -> Counts | None:
    """Running, waiting and KV usage from a Prometheus text page; None when it has none of them."""
    # Only the lines we read reach the parser: an engine's page is mostly histograms.
    lines = [ln for ln in text.splitlines() if ln.startswith(_WANTED)]
    if not lines:
        return None
    sums: dict[str, list[float]] = {}
    try:
        for fam in text_string_to_metric_families("\n".join(lines) + "\n"):
            for s in fam.samples:
                if s.name in _WANTED and math.isfinite(s.value):
                    sums.setdefault(s.name, []).append(s.value)
    except ValueError:
        return None

    def first(names: tuple[str, ...]) -> list[float] | None:
        return next((sums[n] for n in names if n in sums), None)

    running, waiting, kv = first(RUNNING), first(WAITING), first(KV)
    if running is None and waiting is None:
        return None
    return Counts(sum(running or ()), sum(waiting or ()),
                  None if not kv else min(1.0, max(0.0, sum(kv) / len(kv))))


async def read_load(replica: Replica, spec: LoadSpec) -> Counts:
    """GET the replica's metrics page; ValueError (with the reason) when it says nothing usable."""
    url = replica.root + spec.path
    async with replica.client().get(url, timeout=aiohttp.ClientTimeout(total=spec.timeout), allow_redirects=False,
                                    auth=replica.auth) as resp:
        if resp.status != 200:
            raise ValueError(f"GET {url} -> {resp.status}" + (" (redirects are not followed)"
                                                              if 300 <= resp.status < 400 else ""))
        raw = await resp.content.read(MAX_METRICS_BYTES)
    counts = parse_metrics(raw.decode("utf-8", "replace"))
    if counts is None:
        raise ValueError(f"GET {url}: no running/waiting request metrics (vLLM, SGLang or llama.cpp names)")
    return counts


class LoadPoller:
    """One loop for every replica of a least_load pool; each read every `interval` (the shortest of
    the pools that use it) by the gateway that owns it, the others reading what it shares."""

    def __init__(self, replicas: Callable[[], list[tuple[Replica, LoadSpec]]],
                 owns: Callable[[str], bool] = lambda url: True, tick: float = 0.05):
        self._replicas = replicas
        self._owns = owns
        self._tick = tick
        self._task: asyncio.Task | None = None
        self._busy: set[str] = set()
        self._pending: set[asyncio.Task] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="load-poller")

    async def poll(self, r: Replica, spec: LoadSpec) -> None:
        try:
            c = await read_load(r, spec)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            why = f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)
            if why != r.engine_error:
                log.warning("replica %s: engine load unknown (%s); balancing on in-flight counts", r.name, why)
            r.engine_error = why
            return
        finally:
            self._busy.discard(r.url)
        r.engine = EngineLoad(c.running, c.waiting, c.kv, r.load, time.monotonic())
        r.engine_error = ""

    def due(self, now: float) -> list[tuple[Replica, LoadSpec]]:
        out = []
        for r, spec in self._replicas():
            if r.url in self._busy:
                continue
            last = max(r.engine.at if r.engine is not None else 0.0, r.engine_tried)
            # Another gateway reads it (shared state); this one steps in when its readings stop coming.
            every = spec.interval if self._owns(r.url) else 2 * spec.interval + 0.25
            if now - last >= every:
                out.append((r, spec))
        return out

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            for r, spec in self.due(now):
                self._busy.add(r.url)
                r.engine_tried = now
                t = asyncio.get_running_loop().create_task(self.poll(r, spec))
                self._pending.add(t)
                t.add_done_callback(self._pending.discard)
            await asyncio.sleep(self._tick)

    async def aclose(self) -> None:
        for t in (self._task, *self._pending):
            if t is not None:
                t.cancel()
        for t in (self._task, *self._pending):
            if t is not None:
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
