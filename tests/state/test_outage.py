"""Redis killed, restarted, frozen mid-load: no request fails because of it, and sharing resumes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import aiohttp
import pytest
from procs import http_get, start_gateway
from statekit import RedisServer, Shared, chat, health, wait_for

pytestmark = pytest.mark.slow  # a Redis outage under load, seconds by design: `make test`


def _store_up_metric(url: str) -> float:
    for line in http_get(url + "/metrics")[1].decode().splitlines():
        if line.startswith("switchyard_state_store_up{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no switchyard_state_store_up in /metrics")


def test_redis_outage_mid_load_fails_no_request_and_recovers(fresh: Shared, tmp_path) -> None:
    rs = RedisServer(tmp_path)
    gw, url = start_gateway(tmp_path, [fresh.policy_b], "--redis", rs.url, name="gw-outage")
    results: list[tuple[int, float, str]] = []  # (status, seconds, phase)
    phase = ["up"]
    stop = asyncio.Event()
    marker = f"outage-{uuid.uuid4().hex[:6]}"

    async def worker(i: int, s: aiohttp.ClientSession) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            sid = f"w{i}-{n % 5}"
            body = chat("a hard problem" if n % 3 == 0 else "easy one")
            t = time.perf_counter()
            try:
                async with s.post(url + "/v1/chat/completions", data=body,
                                  headers={"Content-Type": "application/json", "x-session-id": sid}) as r:
                    await r.read()
                    st = r.status
            except (aiohttp.ClientError, OSError):
                st = -1
            results.append((st, time.perf_counter() - t, phase[0]))

    def check(cond, what: str, timeout: float = 5.0):
        return asyncio.to_thread(wait_for, cond, timeout, 0.05, what)

    async def scenario() -> dict:
        seen: dict = {}
        async with aiohttp.ClientSession() as s:
            tasks = [asyncio.ensure_future(worker(i, s)) for i in range(4)]
            await asyncio.sleep(0.8)
            phase[0] = "killed"
            rs.kill()
            await check(lambda: health(url)["state"]["healthy"] is False, "/health to report Redis down")
            seen["health_down"] = health(url)["state"]
            seen["metric_down"] = _store_up_metric(url)
            # A session decided while Redis is away lives locally and is pushed back on recovery.
            async with s.post(url + "/v1/chat/completions", data=chat("a hard problem"),
                              headers={"Content-Type": "application/json", "x-session-id": marker}) as r:
                seen["marker_status"] = r.status
            await asyncio.sleep(0.8)
            phase[0] = "restarted"
            rs.start()
            await check(lambda: health(url)["state"]["healthy"] is True, "Redis to be back in /health")
            seen["metric_up"] = _store_up_metric(url)
            await asyncio.sleep(0.5)
            # Frozen, not dead: every call must give up after its short timeout.
            phase[0] = "frozen"
            os.kill(rs.p.pid, signal.SIGSTOP)
            try:
                await check(lambda: health(url)["state"]["healthy"] is False, "a frozen Redis to be noticed")
                await asyncio.sleep(0.8)
            finally:
                os.kill(rs.p.pid, signal.SIGCONT)
            phase[0] = "thawed"
            await check(lambda: health(url)["state"]["healthy"] is True, "Redis to answer again after SIGCONT")
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*tasks)
        return seen

    try:
        seen = asyncio.run(scenario())
        assert seen["health_down"]["serving_on"] == "local state" and seen["health_down"]["error"]
        assert seen["metric_down"] == 0.0 and seen["metric_up"] == 1.0
        assert seen["marker_status"] == 200
        failed = [r for r in results if r[0] != 200]
        assert not failed, failed[:5]
        by_phase = {p: [d for st, d, ph in results if ph == p] for p in ("up", "killed", "restarted", "frozen", "thawed")}
        assert all(by_phase.values()), {p: len(v) for p, v in by_phase.items()}
        # Nobody waits on a dead Redis, and a frozen one costs at most its timeout (0.1 s) once.
        assert max(by_phase["killed"]) < 1.0, max(by_phase["killed"])
        assert max(by_phase["frozen"]) < 1.0, max(by_phase["frozen"])
        st = health(url)["state"]
        assert st["healthy"] is True and st["outages"] == 2
        text = http_get(url + "/metrics")[1].decode()
        assert 'switchyard_state_outages{kind="redis"} 2.0' in text
        assert 'switchyard_state_gateways{kind="redis"} 1.0' in text
        # The session decided during the outage reached the restarted (empty) Redis.
        wait_for(lambda: rs.client().get(f"switchyard:sess:shared\x00\x00{marker}") is not None, 2,
                 what="the outage's session to be resynchronised")
        assert b'"large"' in rs.client().get(f"switchyard:sess:shared\x00\x00{marker}")
        # And its lease is back: this gateway is counted again.
        wait_for(lambda: rs.client().zcard("switchyard:gws") == 1, 2, what="the lease to be renewed")
    finally:
        gw.stop()
        rs.stop()
