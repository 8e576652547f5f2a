"""Sessions belong to their caller: with API keys on, session state is keyed by the key too, so
one key cannot move another key's session (escalate-only would then keep it there); /v1/route
checks a key's permissions and never writes session state; session ids are bounded. Two real
keys, a real gateway, the shared real Redis."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from procs import Proc
from statekit import Shared

from switchyard.gateway.keys import RedisKeyStore, make_key


@pytest.fixture(scope="module")
def keyed(shared: Shared) -> Iterator[tuple[Proc, str, dict[str, str]]]:
    keys: dict[str, str] = {}
    store = RedisKeyStore(shared.redis.url)

    async def put_all() -> None:
        for name, pools in (("alice", None), ("bob", None), ("small-only", ["small"])):
            key, rec = make_key(f"tenancy-{name}", None, pools, None, None)
            keys[name] = key
            await store.put(rec)
        await store.aclose()

    asyncio.run(put_all())
    gw, url = shared.gateway("--auth", name="gw-tenancy")
    try:
        yield gw, url, keys
    finally:
        gw.stop()


def _post(url: str, path: str, key: str, text: str, session: str, **extra) -> tuple[int, dict, dict]:
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": text}],
                         "metadata": {"session_id": session}, **extra})
    req = urllib.request.Request(url + path, data=body, headers={"Content-Type": "application/json",
                                                                  "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), orjson.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), orjson.loads(e.read())


def test_one_key_cannot_steer_another_keys_session(keyed):
    gw, url, keys = keyed
    status, h, _ = _post(url, "/v1/chat/completions", keys["alice"], "a hard problem", "shared-id")
    assert status == 200 and h["x-switchyard-pool"] == "large"
    # bob uses the same session id: his session is his own, it is not pinned to large by alice's
    status, h, _ = _post(url, "/v1/chat/completions", keys["bob"], "hello", "shared-id")
    assert status == 200 and h["x-switchyard-pool"] == "small", h
    # ... and alice's session is still pinned where alice's turn put it
    status, h, _ = _post(url, "/v1/chat/completions", keys["alice"], "hello", "shared-id")
    assert status == 200 and h["x-switchyard-pool"] == "large" and h["x-switchyard-rule"] == "session-pin"


def test_route_checks_permissions_and_writes_no_session_state(keyed):
    gw, url, keys = keyed
    status, _, out = _post(url, "/v1/route", keys["bob"], "a hard problem", "dry-only")
    assert status == 200 and out["pool"] == "large"
    status, h, _ = _post(url, "/v1/chat/completions", keys["bob"], "hello", "dry-only")
    assert status == 200 and h["x-switchyard-pool"] == "small"  # /v1/route pinned nothing
    status, _, out = _post(url, "/v1/route", keys["small-only"], "a hard problem", "x")
    assert status == 403 and out["error"]["code"] == "pool_not_allowed"
    status, _, out = _post(url, "/v1/route", "sk-sy-not-a-key", "hello", "x")
    assert status == 401


def test_session_ids_are_bounded(keyed, shared: Shared):
    gw, url, keys = keyed
    before = _rss_kb(gw.p.pid)
    for i in range(10):
        status, _, _ = _post(url, "/v1/chat/completions", keys["alice"], "hello", f"{i}" + "s" * 5_000_000)
        assert status == 200
    stored = [k for k in shared.redis.client().scan_iter("switchyard:sess:*")]
    assert stored and max(len(k) for k in stored) < 512  # digests, not 5 MB ids
    assert _rss_kb(gw.p.pid) - before < 60_000


def test_a_huge_session_header_is_refused(keyed):
    gw, url, keys = keyed
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nx-session-id: " + b"s" * 200_000
                  + b"\r\nContent-Length: 2\r\n\r\n{}")
        s.settimeout(10)
        assert s.recv(64).startswith(b"HTTP/1.1 431")


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0
