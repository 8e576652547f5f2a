"""SIGTERM under load: readiness goes 503, every request (streams included) finishes, then the gateway exits."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import pytest
from procs import start_gateway
from statekit import Shared, chat

pytestmark = pytest.mark.slow  # SIGTERM to a gateway process under load: `make test`


def test_sigterm_drain_under_load_loses_no_request(fresh: Shared, tmp_path) -> None:
    fresh.control("s0", delay_ms=300, chunk_delay_ms=60)
    fresh.control("s1", delay_ms=300, chunk_delay_ms=60)
    gw, url = start_gateway(tmp_path, [fresh.policy_b], "--drain-grace", "10", name="gw-drain")
    outcomes: list[tuple[str, int, bool, float]] = []  # (kind, status, complete, started)
    ready_503: list[float] = []
    sent_at_term: list[int] = []
    t_term: list[float] = []

    async def worker(i: int, s: aiohttp.ClientSession) -> None:
        n = 0
        while True:
            # A load balancer's view: stop sending once readiness says no.
            async with s.get(url + "/health/ready") as r:
                if r.status == 503:
                    ready_503.append(time.time())
                    return
                assert r.status == 200
            n += 1
            stream = (i + n) % 2 == 0
            started = time.time()
            try:
                async with s.post(url + "/v1/chat/completions", data=chat(stream=stream),
                                  headers={"Content-Type": "application/json"}) as r:
                    body = await r.read()
                    status = r.status
                complete = body.rstrip().endswith(b"data: [DONE]") if stream else body.startswith(b'{"id"')
            except (aiohttp.ClientError, OSError):
                status, complete = -1, False
            outcomes.append(("stream" if stream else "json", status, complete, started))

    async def scenario() -> None:
        async with aiohttp.ClientSession() as s:
            tasks = [asyncio.ensure_future(worker(i, s)) for i in range(6)]
            await asyncio.sleep(1.0)
            sent_at_term.append(len(outcomes))
            t_term.append(time.time())
            os.kill(gw.p.pid, signal.SIGTERM)
            await asyncio.wait_for(asyncio.gather(*tasks), 20)

    try:
        asyncio.run(scenario())
        rc = gw.p.wait(15)
    finally:
        gw.stop()
    assert rc == 0
    assert len(ready_503) == 6  # every client saw readiness turn 503
    failed = [o for o in outcomes if o[1] != 200 or not o[2]]
    assert not failed, failed
    in_flight_at_term = [o for o in outcomes if o[3] < t_term[0]][sent_at_term[0]:]
    assert len(in_flight_at_term) >= 3  # requests (streams among them) that were running at SIGTERM finished
    assert {o[0] for o in outcomes} == {"stream", "json"}
    log = (tmp_path / "gw-drain.log").read_text()
    assert "SIGTERM: draining" in log and "Finished server process" in log
