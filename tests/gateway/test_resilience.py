"""Failures: dead replicas, broken streams, circuit breakers, full queues, clients that leave.

A replica killed, a replica dying mid-stream and clients that leave need processes (`own`: a real
gateway in front of real upstreams); breakers, queues, fallback, 502 and 504 are the gateway's
logic and run in process (`light`: tests/gateway/inproc.py, the same cluster served on loopback
sockets, the same SDK clients)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import inproc
import openai
import orjson
import pytest
from gwkit import make_cluster, stop_cluster
from procs import http_get


@pytest.fixture
def own(tmp_path):
    made = []

    def make(**kw):
        c = make_cluster(tmp_path, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        stop_cluster(c)


@pytest.fixture
def light(tmp_path):
    with inproc.stack() as s:
        yield lambda **kw: inproc.make_cluster(s, tmp_path, **kw)


BODY = {"model": "small", "messages": [{"role": "user", "content": "hi"}]}


async def _load(url: str, n: int, concurrency: int, body: dict = BODY) -> list[tuple[int, dict]]:
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as s:
        async def one() -> tuple[int, dict]:
            async with sem, s.post(url + "/v1/chat/completions", json=body) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}
        return await asyncio.gather(*(one() for _ in range(n)))


@pytest.mark.slow
def test_replica_killed_under_load_loses_no_request(own):
    c = own()
    c.control("s0", delay_ms=20)
    c.control("s1", delay_ms=20)
    started: list[float] = []
    done = 0

    async def run():
        sem = asyncio.Semaphore(16)
        reached = asyncio.Event()

        async with aiohttp.ClientSession() as s:
            async def one() -> tuple[float, int, dict]:
                nonlocal done
                async with sem:
                    t = time.monotonic()
                    async with s.post(c.url + "/v1/chat/completions", json=BODY) as r:
                        await r.read()
                        done += 1
                        if done == 100:
                            reached.set()
                        return t, r.status, {k.lower(): v for k, v in r.headers.items()}

            task = asyncio.gather(*(one() for _ in range(300)))
            # Kill on progress, not on a clock: on a slow or a fast machine a third of the load is
            # done and two thirds are still to come when s0 dies.
            await reached.wait()
            c.ups["s0"][0].kill()  # SIGKILL mid-load: connections drop, new ones are refused
            started.append(time.monotonic())
            return await task

    results = asyncio.run(run())
    codes = [s for _, s, _ in results]
    assert codes.count(200) == 300, {s: codes.count(s) for s in set(codes)}
    killed_at = started[0]
    after = [h["x-switchyard-replica"] for t, _, h in results if t > killed_at + 0.05]
    assert len(after) >= 50, len(after)
    assert set(after) == {"s1"}
    assert any(int(h.get("x-switchyard-attempts", 1)) > 1 for _, _, h in results)


@pytest.mark.slow
def test_replica_dying_mid_stream_gives_a_clean_error(own):
    c = own()
    c.control("s0", die_midstream=True, die_after_chunks=2, chunk_delay_ms=20)
    c.control("s1", die_midstream=True, die_after_chunks=2, chunk_delay_ms=20)
    cl = openai.OpenAI(base_url=c.url + "/v1", api_key="x", max_retries=0, timeout=10)
    got = []
    t0 = time.time()
    with pytest.raises(openai.APIError) as e:
        for chunk in cl.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}],
                                                stream=True):
            got.append(chunk)
    assert time.time() - t0 < 5  # an error, not a hang
    assert len(got) == 2  # what arrived before the failure was relayed
    assert "mid-stream" in str(e.value)


def test_circuit_opens_after_failures_and_closes_after_a_good_trial(light):
    c = light()
    c.control("s0", fail=500)
    cl = openai.OpenAI(base_url=c.url + "/v1", api_key="x", max_retries=0)
    for _ in range(12):  # every request still succeeds: retried on s1
        cl.chat.completions.create(**BODY)
    pools = orjson.loads(http_get(c.url + "/health")[1])["policies"]["test"]["pools"]
    s0 = next(r for r in pools["small"]["replicas"] if r["name"] == "s0")
    assert s0["circuit"] == "open" and "HTTP 500" in s0["circuit_error"]
    served_while_open = c.upstream_state("s0")["served"]
    for _ in range(5):
        cl.chat.completions.create(**BODY)
    assert c.upstream_state("s0")["served"] == served_while_open  # ejected: no traffic
    c.control("s0", fail=0)
    time.sleep(1.2)  # cooldown 1s, then one trial request closes the circuit
    for _ in range(6):
        cl.chat.completions.create(**BODY)
    pools = orjson.loads(http_get(c.url + "/health")[1])["policies"]["test"]["pools"]
    s0 = next(r for r in pools["small"]["replicas"] if r["name"] == "s0")
    assert s0["circuit"] == "closed"
    assert c.upstream_state("s0")["served"] > served_while_open
    metrics = http_get(c.url + "/metrics")[1].decode()
    assert "switchyard_retries_total" in metrics


def test_queue_then_429_with_retry_after(light):
    c = light(max_inflight=1, queue_size=1)
    c.control("s0", delay_ms=800)
    c.control("s1", delay_ms=800)
    c.control("l0", fail=503)  # the fallback pool cannot help either

    results = asyncio.run(_load(c.url, 5, 5))
    codes = sorted(s for s, _ in results)
    assert codes.count(200) >= 2  # two slots
    rejected = [h for s, h in results if s == 429]
    assert rejected, codes
    assert all(int(h["retry-after"]) >= 1 for h in rejected)


@pytest.mark.slow  # seconds of waiting or load by design: `make test`
def test_pool_with_no_healthy_replica_falls_back(light):
    c = light()
    c.control("s0", health=503)
    c.control("s1", health=503)
    time.sleep(1.2)  # health checks every 0.5 s mark both unhealthy
    status, headers = asyncio.run(_load(c.url, 1, 1))[0]
    assert status == 200
    assert headers["x-switchyard-pool"] == "large" and headers["x-switchyard-fallback-from"] == "small"
    c.control("s0", health=200)
    time.sleep(1.2)
    status, headers = asyncio.run(_load(c.url, 1, 1))[0]
    assert headers["x-switchyard-pool"] == "small" and headers["x-switchyard-replica"] == "s0"


def test_every_replica_failing_is_a_502(light):
    c = light()
    for n in ("s0", "s1", "l0"):
        c.control(n, fail=500)
    cl = openai.OpenAI(base_url=c.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        cl.chat.completions.create(model="large", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 502 and e.value.body["type"] == "upstream_error"


def test_upstream_timeout_is_a_504(light):
    c = light(timeout="300ms")
    c.control("s0", delay_ms=2000)
    c.control("s1", delay_ms=2000)
    c.control("l0", delay_ms=2000)
    cl = openai.OpenAI(base_url=c.url + "/v1", api_key="x", max_retries=0)
    t0 = time.time()
    with pytest.raises(openai.APIStatusError) as e:
        cl.chat.completions.create(**BODY)
    assert e.value.status_code == 504
    assert time.time() - t0 < 3


@pytest.mark.slow
def test_client_disconnect_cancels_the_upstream_request(own):
    c = own()
    c.control("s0", delay_ms=3000)
    c.control("s1", delay_ms=3000)

    async def leave_early():
        async with aiohttp.ClientSession() as s:
            try:
                async with s.post(c.url + "/v1/chat/completions", json=BODY,
                                  timeout=aiohttp.ClientTimeout(total=0.3)) as r:
                    await r.read()
            except TimeoutError:
                pass

    asyncio.run(leave_early())

    def upstream(field: str) -> int:
        return c.upstream_state("s0")[field] + c.upstream_state("s1")[field]

    deadline = time.monotonic() + 5  # the upstream notices the closed connection within ms; CI may be slow
    while (upstream("cancelled"), upstream("inflight")) != (1, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream("cancelled") == 1 and upstream("inflight") == 0
    metrics = http_get(c.url + "/metrics")[1].decode()
    assert 'switchyard_inflight{pool="test/small",replica="s0"} 0.0' in metrics
    assert 'switchyard_inflight{pool="test/small",replica="s1"} 0.0' in metrics


@pytest.mark.slow
def test_stream_client_disconnect_closes_upstream(own):
    c = own()
    c.control("s0", chunk_delay_ms=300, stream_chunks=20)
    c.control("s1", chunk_delay_ms=300, stream_chunks=20)

    async def read_one_then_leave():
        async with aiohttp.ClientSession() as s, s.post(c.url + "/v1/chat/completions",
                                                        json={**BODY, "stream": True}) as r:
            await r.content.readany()

    asyncio.run(read_one_then_leave())
    time.sleep(1.0)
    assert c.upstream_state("s0")["cancelled"] + c.upstream_state("s1")["cancelled"] == 1
    metrics = http_get(c.url + "/metrics")[1].decode()
    assert 'replica="s0"} 0.0' in metrics and 'switchyard_inflight{pool="test/small",replica="s1"} 0.0' in metrics
