"""Active health checks: GET <root>/health (or /v1/models where a server has no /health)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from switchyard.pools import fit
from switchyard.pools.replica import Replica

log = logging.getLogger("switchyard.health")

MAX_HEALTH_BYTES = 64 * 1024  # a health answer is a few bytes; the rest is never read


async def check(replica: Replica, timeout: float) -> tuple[bool, str]:
    session = replica.client()
    to = aiohttp.ClientTimeout(total=timeout)
    paths = [replica.health_path] if replica.health_path else [replica.root + "/health", replica.url + "/models"]
    last = ""
    for url in paths:
        if not url.startswith("http"):
            url = replica.root + url
        try:
            # Never followed: a redirect could send the probe (and the replica's credentials) anywhere.
            async with session.get(url, timeout=to, allow_redirects=False, auth=replica.auth) as resp:
                await resp.content.read(MAX_HEALTH_BYTES)
                if resp.status == 200:
                    replica.health_path = url
                    return True, ""
                last = f"GET {url} -> {resp.status}" + (" (redirects are not followed)"
                                                        if 300 <= resp.status < 400 else "")
                if resp.status not in (404, 405):
                    return False, last  # the server says it is not ready: believe it
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return False, f"GET {url}: {type(e).__name__}: {e}".rstrip(": ")
    return False, last


class HealthChecker:
    """One loop for all replicas; each replica checked every `interval` of the pools that use it."""

    def __init__(self, replicas: Callable[[], list[tuple[Replica, float, float]]]):
        self._replicas = replicas  # -> [(replica, interval, timeout)]
        self._task: asyncio.Task | None = None
        self._next: dict[str, float] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="health-checks")

    async def _one(self, r: Replica, timeout: float) -> None:
        ok, why = await check(r, timeout)
        if ok != r.healthy:
            log.warning("replica %s is now %s%s", r.name, "healthy" if ok else "unhealthy", f": {why}" if why else "")
        if ok and (r.windows is None or not r.healthy):  # (re)started: its context window may be new
            await fit.discover(r, timeout)
        r.healthy, r.health_error = ok, why

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            due = []
            for r, interval, timeout in self._replicas():
                if interval <= 0:
                    continue
                if self._next.get(r.url, 0.0) <= now:
                    self._next[r.url] = now + interval
                    due.append(self._one(r, timeout))
            if due:
                await asyncio.gather(*due, return_exceptions=True)
            await asyncio.sleep(0.25)

    async def aclose(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
