"""Two gateway processes on one real Redis behave as one gateway."""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson
from procs import http_post
from statekit import Shared, chat, health, post_many, replica, wait_for


def _post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, bytes]:
    return asyncio.run(post_many(url, [body], headers))[0]


def test_session_routed_by_one_gateway_is_kept_by_the_other(fresh: Shared) -> None:
    sid = f"sess-{uuid.uuid4().hex[:8]}"
    st, h, _ = _post(fresh.a_url, chat("a hard problem to start with"), {"x-session-id": sid})
    assert st == 200 and h["x-switchyard-pool"] == "large" and h["x-switchyard-rule"] == "keyword"
    # Alone, gateway B would send this easy turn to `small`; the shared session pins it to `large`.
    st, h, _ = _post(fresh.b_url, chat("thanks, now something easy"), {"x-session-id": sid})
    assert st == 200 and h["x-switchyard-pool"] == "large", h
    assert h["x-switchyard-rule"] == "session-pin"
    other = f"sess-{uuid.uuid4().hex[:8]}"
    st, h, _ = _post(fresh.b_url, chat("something easy"), {"x-session-id": other})
    assert h["x-switchyard-pool"] == "small"
    # Both gateways list the session from Redis through the admin API.
    st, raw = http_get_admin(fresh.a_url + "/admin/sessions?limit=1000")
    assert st == 200
    rows = {r["session_id"]: r for r in orjson.loads(raw)["sessions"]}
    assert rows[sid]["pool"] == "large" and rows[other]["pool"] == "small"


def http_get_admin(url: str, key: str = "adm-secret") -> tuple[int, bytes]:
    import urllib.request

    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_post_admin(url: str, key: str = "adm-secret") -> tuple[int, bytes]:
    import urllib.request

    req = urllib.request.Request(url, data=b"", method="POST", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_replica_ejected_through_one_gateway_is_skipped_by_the_other(fresh: Shared) -> None:
    fresh.control("e0", fail=503)
    # Through A: e0 fails, A retries on e1 (clients see 200) and opens e0's circuit after 2 failures.
    for _ in range(8):
        st, _, _ = _post(fresh.a_url, chat(model="eject"))
        assert st == 200
        if replica(fresh.a_url, "e0")["circuit"] == "open":
            break
    assert replica(fresh.a_url, "e0")["circuit"] == "open"
    wait_for(lambda: replica(fresh.b_url, "e0")["circuit"] == "open", 3, what="B to see e0's circuit open")
    # e0 works again, but its circuit (20 s cooldown) is open for every gateway: B never sends it anything.
    fresh.control("e0", fail=0)
    before = fresh.served("e0")
    res = asyncio.run(post_many(fresh.b_url, [chat(model="eject")] * 12))
    assert all(st == 200 for st, _, _ in res)
    assert {h["x-switchyard-replica"] for _, h, _ in res} == {"e1"}
    assert fresh.served("e0") == before
    assert "ejected" in replica(fresh.b_url, "e0")["state"]


def test_least_inflight_balances_across_gateways(fresh: Shared) -> None:
    # A's pool `bal` has only b0; B's has b0 and b1. Six slow requests through A occupy b0;
    # B, seeing them through Redis, sends its six to b1 although b0 is idle as far as B alone knows.
    fresh.control("b0", delay_ms=1500)
    fresh.control("b1", delay_ms=1500)

    async def scenario():
        first = asyncio.ensure_future(post_many(fresh.a_url, [chat(model="bal")] * 6))
        await asyncio.to_thread(wait_for, lambda: replica(fresh.b_url, "b0")["remote_inflight"] == 6, 3, 0.02,
                                "B to see A's 6 in flight on b0")
        second = await post_many(fresh.b_url, [chat(model="bal")] * 6)
        return await first, second

    t0 = time.time()
    first, second = asyncio.run(scenario())
    assert all(st == 200 for st, _, _ in first + second)
    assert {h["x-switchyard-replica"] for _, h, _ in first} == {"b0"}
    assert [h["x-switchyard-replica"] for _, h, _ in second] == ["b1"] * 6
    assert time.time() - t0 < 6
    # Everything finished: no count stays behind on either gateway.
    wait_for(lambda: replica(fresh.b_url, "b0")["remote_inflight"] == 0, 2, what="remote counts back to 0")
    assert replica(fresh.a_url, "b1")["remote_inflight"] == 0 if _has(fresh.a_url, "b1") else True


def _has(url: str, name: str) -> bool:
    try:
        replica(url, name)
        return True
    except KeyError:
        return False


def test_killed_gateway_leaves_no_stuck_counts(fresh: Shared) -> None:
    fresh.control("b0", delay_ms=4000)
    c, c_url = fresh.gateway("--lease-ttl", "1", name="gw-c", policy=fresh.policy_a)
    try:
        async def fire():
            return await post_many(c_url, [chat(model="bal")] * 5, timeout=10)

        import threading

        out: list = []
        t = threading.Thread(target=lambda: out.append(asyncio.run(fire())))
        t.start()
        wait_for(lambda: replica(fresh.b_url, "b0")["remote_inflight"] == 5, 3, 0.02, "B to see C's 5 in flight")
        c.kill()  # SIGKILL with 5 requests in flight: no chance to clean up
        killed = time.time()
        wait_for(lambda: replica(fresh.b_url, "b0")["remote_inflight"] == 0, 3, 0.05, "C's lease to expire")
        gone_after = time.time() - killed
        t.join(10)
        assert out and all(st == -1 for st, _, _ in out[0])  # C's clients lost their connection
        assert gone_after <= 1.5, gone_after  # lease 1 s + one sync tick
        assert health(fresh.b_url)["state"]["gateways"] == 2
    finally:
        c.stop()


def test_admin_drain_through_one_gateway_waits_for_the_others_requests(fresh: Shared) -> None:
    fresh.control("s0", delay_ms=800)
    fresh.control("s1", delay_ms=800)
    assert http_post_admin(fresh.a_url + "/admin/replicas/s0/drain", key="wrong")[0] == 401

    async def scenario():
        load = asyncio.ensure_future(post_many(fresh.b_url, [chat()] * 4))
        await asyncio.to_thread(wait_for, lambda: replica(fresh.a_url, "s0")["remote_inflight"] >= 1, 3, 0.02,
                                "A to see B's requests on s0")
        t0 = time.time()
        st, raw = await asyncio.to_thread(http_post_admin, fresh.a_url + "/admin/replicas/s0/drain?timeout=10")
        return await load, st, orjson.loads(raw), time.time() - t0

    load, st, body, waited = asyncio.run(scenario())
    assert all(s == 200 for s, _, _ in load)
    assert st == 200 and body["drained"] is True and body["state"] == "drained"
    assert waited >= 0.3  # it waited for B's requests on s0 (800 ms each)
    wait_for(lambda: replica(fresh.b_url, "s0")["state"] == "drained", 2, what="B to see s0 drained")
    fresh.control("s0", delay_ms=0)
    fresh.control("s1", delay_ms=0)
    res = asyncio.run(post_many(fresh.b_url, [chat()] * 8))
    assert {h["x-switchyard-replica"] for _, h, _ in res} == {"s1"}
    st, raw = http_post_admin(fresh.b_url + "/admin/replicas/s0/undrain")
    assert st == 200
    wait_for(lambda: replica(fresh.a_url, "s0")["state"] == "healthy", 2, what="A to see s0 back")
    res = asyncio.run(post_many(fresh.a_url, [chat()] * 8))
    assert "s0" in {h["x-switchyard-replica"] for _, h, _ in res}


def test_admin_api_reload_and_listing(fresh: Shared) -> None:
    st, raw = http_post_admin(fresh.a_url + "/admin/reload")
    assert st == 200 and orjson.loads(raw)["policies"] == ["shared"]
    st, raw = http_get_admin(fresh.a_url + "/admin/replicas")
    body = orjson.loads(raw)
    assert st == 200 and {r["name"] for r in body["replicas"]} >= {"s0", "s1", "l0", "b0", "e0"}
    assert body["state"]["kind"] == "redis" and body["state"]["healthy"] is True
    assert http_get_admin(fresh.a_url + "/admin/replicas", key="nope")[0] == 401
    assert http_post(fresh.a_url + "/admin/reload", b"")[0] == 401
