"""Across hosts: two gateways on one Redis behind a client-side round-robin act as one.

The client sends each request to the next gateway on a fresh connection, as a DNS or client
load balancer would; a session stays pinned, a key's rpm holds over both, a stored response
made on one is continued on the other, and when one gateway is SIGKILLed mid-load every request
either succeeds or fails with a connection error the client retries on the other gateway.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import orjson
import pytest
from procs import Proc, http_get
from statekit import ADMIN_KEY, Shared, chat, health

from switchyard.gateway.keys import RedisKeyStore, make_key

pytestmark = pytest.mark.slow  # several gateways on one redis-server

RETRYABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError)


@dataclass
class Hosts:
    gws: list[tuple[Proc, str]]
    keys: dict[str, str]

    @property
    def urls(self) -> list[str]:
        return [u for _, u in self.gws]


@pytest.fixture(scope="module")
def hosts(shared: Shared) -> Iterator[Hosts]:
    keys: dict[str, str] = {}
    store = RedisKeyStore(shared.redis.url)

    async def put_all() -> None:
        for name, rpm in (("rr-open", None), ("rr-rpm4", 4)):
            key, rec = make_key(name, None, None, rpm, None)
            keys[name] = key
            await store.put(rec)
        await store.aclose()

    asyncio.run(put_all())
    gws: list[tuple[Proc, str]] = []
    try:
        for name in ("host-1", "host-2"):
            gws.append(shared.gateway("--auth", "--admin-key", ADMIN_KEY, name=name))
        yield Hosts(gws, keys)
    finally:
        for proc, _ in gws:
            proc.stop()


class RoundRobin:
    """A client-side balancer: the next gateway each request, a fresh connection each time; on a
    connection error, the same request once more on each other gateway."""

    def __init__(self, urls: list[str], key: str) -> None:
        self.urls = urls
        self.key = key
        self._next = itertools.count()
        self.retried = 0

    async def post(self, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict, bytes, str]:
        first = next(self._next)
        h = {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}", **(headers or {})}
        err: BaseException | None = None
        for k in range(len(self.urls)):
            url = self.urls[(first + k) % len(self.urls)]
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s, \
                        s.post(url + path, data=orjson.dumps(body), headers=h) as r:
                    raw = await r.read()
                    if body.get("stream") and r.status == 200 and not raw.rstrip().endswith(b"data: [DONE]"):
                        raise aiohttp.ClientPayloadError("stream cut")  # the gateway died mid-stream
                    return r.status, dict(r.headers), raw, url
            except RETRYABLE as e:
                err = e
                self.retried += 1
        raise AssertionError(f"every gateway failed: {err!r}")


def _chat(text: str = "hello", **extra) -> dict:
    return orjson.loads(chat(text, **extra))


def test_a_session_stays_pinned_across_round_robin(hosts: Hosts) -> None:
    rr = RoundRobin(hosts.urls, hosts.keys["rr-open"])
    sid = f"rr-{uuid.uuid4().hex[:8]}"

    async def turns() -> list[tuple[int, dict, str]]:
        out = []
        for i in range(8):
            text = "a hard problem to start with" if i == 0 else f"easy turn {i}"
            st, h, _, url = await rr.post("/v1/chat/completions", _chat(text), {"x-session-id": sid})
            out.append((st, h, url))
        return out

    out = asyncio.run(turns())
    assert {u for _, _, u in out} == set(hosts.urls)  # both gateways served the session
    assert all(st == 200 and h["x-switchyard-pool"] == "large" for st, h, _ in out), out
    assert all(h["x-switchyard-rule"] == "session-pin" for _, h, _ in out[1:])


def test_rpm_is_shared_by_the_gateways(hosts: Hosts) -> None:
    if time.time() % 60 > 50:  # the windows are whole minutes: stay clear of a boundary
        time.sleep(60 - time.time() % 60 + 0.2)
    rr = RoundRobin(hosts.urls, hosts.keys["rr-rpm4"])

    async def send() -> list[int]:
        out = []
        for _ in range(8):
            out.append((await rr.post("/v1/chat/completions", _chat()))[0])
            await asyncio.sleep(0.3)  # a few sync ticks: each gateway sees the other's count
        return out

    statuses = asyncio.run(send())
    assert statuses.count(200) == 4 and statuses.count(429) == 4, statuses  # alone, each would allow 4


def test_a_stored_response_is_continued_on_the_other_gateway(shared: Shared, hosts: Hosts) -> None:
    rr = RoundRobin(hosts.urls, hosts.keys["rr-open"])
    marker = f"remember {uuid.uuid4().hex[:8]}"

    async def chain() -> tuple:
        st1, _, raw1, url1 = await rr.post("/v1/responses", {"model": "auto", "input": marker, "store": True})
        first = orjson.loads(raw1)
        st2, h2, raw2, url2 = await rr.post("/v1/responses", {"model": "auto", "input": "and now?",
                                                              "previous_response_id": first["id"]})
        return st1, first, url1, st2, h2, orjson.loads(raw2), url2

    st1, first, url1, st2, h2, second, url2 = asyncio.run(chain())
    assert st1 == 200 and first["id"].startswith("resp")
    assert url1 != url2 and st2 == 200, second
    assert second["previous_response_id"] == first["id"]
    # The replica that answered turn two got turn one's input too: the other gateway read it from Redis.
    name = h2["x-switchyard-replica"]
    sent = orjson.loads(http_get(shared.ups[name][1] + "/_state")[1])["last_body"]["messages"]
    assert any(m["role"] == "user" and marker in str(m["content"]) for m in sent), sent


def test_one_gateway_killed_mid_load_fails_no_request(shared: Shared, hosts: Hosts) -> None:
    shared.control("s0", delay_ms=40)
    shared.control("s1", delay_ms=40)
    victim, victim_url = shared.gateway("--auth", "--admin-key", ADMIN_KEY, name="host-victim")
    survivor_url = hosts.urls[0]
    rr = RoundRobin([victim_url, survivor_url], hosts.keys["rr-open"])
    done: list[tuple[int, str, float]] = []
    stop = time.time() + 3.0

    async def client(i: int) -> None:
        n = 0
        while time.time() < stop:
            n += 1
            st, _, _, url = await rr.post("/v1/chat/completions", _chat(f"load {i}", stream=(i + n) % 3 == 0))
            done.append((st, url, time.time()))

    async def scenario() -> float:
        tasks = [asyncio.ensure_future(client(i)) for i in range(8)]
        await asyncio.sleep(1.0)
        killed_at = time.time()
        victim.kill()  # SIGKILL: no drain, connections reset mid-request
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return killed_at

    try:
        killed_at = asyncio.run(scenario())
    finally:
        victim.stop()
        shared.control("s0", delay_ms=0)
        shared.control("s1", delay_ms=0)
    assert all(st == 200 for st, _, _ in done), [d for d in done if d[0] != 200]
    assert any(u == victim_url and t < killed_at for _, u, t in done)  # the victim served before it died
    assert any(u == survivor_url and t > killed_at for _, u, t in done)
    assert rr.retried >= 1  # requests that hit the dead gateway went to the other one
    # The survivor stays healthy; the dead gateway's in-flight counts expire with its lease.
    assert health(survivor_url)["status"] in ("ok", "degraded")


HAPROXY_CFG = """
global
  maxconn 512
defaults
  mode http
  timeout connect 1s
  timeout client 20s
  timeout server 20s
  retries 2
  option redispatch
  # A request that met a closed keep-alive connection (or none at all) goes to the other server;
  # one that reached a gateway is never sent twice.
  retry-on conn-failure empty-response
frontend fe
  bind 127.0.0.1:{port}
  default_backend gateways
backend gateways
  balance roundrobin
  option httpchk GET /health/ready
  http-check expect status 200
  default-server inter 100ms fall 1 rise 2
  server victim 127.0.0.1:{victim}{check}
  server survivor 127.0.0.1:{survivor}{check}
"""


def test_haproxy_health_checks_drain_a_sigtermed_gateway(shared: Shared, hosts: Hosts, tmp_path) -> None:
    """HAProxy (Debian's) in front: readiness 503 on SIGTERM takes the gateway out of rotation
    before it closes its listener; no request fails and the drained gateway exits 0."""
    import shutil
    import subprocess
    from urllib.parse import urlsplit

    from procs import free_port

    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    shared.control("s0", delay_ms=60)
    shared.control("s1", delay_ms=60)
    victim, victim_url = shared.gateway("--auth", "--admin-key", ADMIN_KEY, "--drain-grace", "5", "--access-log",
                                        name="host-drained")
    port = free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(HAPROXY_CFG.format(port=port, victim=urlsplit(victim_url).port,
                                      survivor=urlsplit(hosts.urls[0]).port, check=" check"))
    lb = subprocess.Popen(["haproxy", "-f", str(cfg), "-db"], stdout=(tmp_path / "haproxy.log").open("w"),
                          stderr=subprocess.STDOUT, start_new_session=True)
    lb_url = f"http://127.0.0.1:{port}"
    h = {"Content-Type": "application/json", "Authorization": f"Bearer {hosts.keys['rr-open']}"}
    outcomes: list[int] = []
    stop = [time.time() + 30.0]

    async def client(i: int, s: aiohttp.ClientSession) -> None:
        n = 0
        while time.time() < stop[0]:
            n += 1
            body = chat(f"lb {i}", stream=(i + n) % 3 == 0)
            try:
                async with s.post(lb_url + "/v1/chat/completions", data=body, headers=h) as r:
                    raw = await r.read()
                    ok = r.status == 200 and (raw.rstrip().endswith(b"data: [DONE]") or raw.startswith(b'{"id"'))
                    outcomes.append(200 if ok else r.status)
            except RETRYABLE:
                outcomes.append(-1)

    async def scenario() -> int:
        async with aiohttp.ClientSession() as s:
            deadline = time.time() + 10
            while True:  # HAProxy up, and both servers seen healthy
                try:
                    async with s.get(lb_url + "/health/live") as r:
                        if r.status == 200:
                            break
                except RETRYABLE:
                    pass
                assert time.time() < deadline, "haproxy did not come up"
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            tasks = [asyncio.ensure_future(client(i, s)) for i in range(8)]
            await asyncio.sleep(1.5)
            victim.p.send_signal(15)  # SIGTERM: readiness 503, then the listener closes after a quiet spell
            rc = await asyncio.get_running_loop().run_in_executor(None, victim.p.wait, 20)
            stop[0] = time.time() + 1.0  # a second more on the survivor alone
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
            return rc

    try:
        rc = asyncio.run(scenario())
    finally:
        victim.stop()
        lb.terminate()
        lb.wait(10)
        shared.control("s0", delay_ms=0)
        shared.control("s1", delay_ms=0)
    served_by_victim = victim.log.read_text().count("POST /v1/chat/completions")
    assert rc == 0
    assert served_by_victim > 0  # HAProxy did balance onto it before the drain
    assert outcomes and all(o == 200 for o in outcomes), [o for o in outcomes if o != 200]
    log = (tmp_path / "haproxy.log").read_text()
    assert "victim is DOWN" in log, log[-2000:]
