"""API keys on two gateways sharing one Redis: 401, 403, 429 with shared rpm/tpm, usage counting."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest
from procs import ROOT, Proc, http_get
from statekit import ADMIN_KEY, Shared, chat, health, post_many, wait_for

from switchyard.gateway.keys import RedisKeyStore, make_key


@dataclass
class AuthPair:
    e1: Proc
    e1_url: str
    e2: Proc
    e2_url: str
    keys: dict[str, str]  # name -> key


def admin_get(url: str) -> str:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.read().decode()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "switchyard.cli", "keys", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


@pytest.fixture(scope="module")
def pair(shared: Shared) -> Iterator[AuthPair]:
    specs = {
        "open": (None, None, None, None),
        "other-policy": (["other"], None, None, None),
        "small-only": (None, ["small"], None, None),
        "auto-only": (["auto"], None, None, None),
        "rpm4": (None, None, 4, None),
        "tpm40": (None, None, None, 40),
        "tpm-stream": (None, None, None, 30),
    }
    keys: dict[str, str] = {}
    store = RedisKeyStore(shared.redis.url)

    async def put_all() -> None:
        for name, (pol, pools, rpm, tpm) in specs.items():
            key, rec = make_key(name, pol, pools, rpm, tpm)
            keys[name] = key
            await store.put(rec)
        await store.aclose()

    asyncio.run(put_all())
    e1, e1_url = shared.gateway("--auth", "--admin-key", ADMIN_KEY, name="gw-auth1")
    try:
        e2, e2_url = shared.gateway("--auth", "--admin-key", ADMIN_KEY, name="gw-auth2")
    except BaseException:
        e1.stop()
        raise
    yield AuthPair(e1, e1_url, e2, e2_url, keys)
    e1.stop()
    e2.stop()


def _post(url: str, body: bytes, key: str | None) -> tuple[int, dict, dict]:
    h = {"Authorization": f"Bearer {key}"} if key is not None else {}
    st, hdrs, raw = asyncio.run(post_many(url, [body], h))[0]
    return st, hdrs, orjson.loads(raw) if raw.startswith(b"{") else {}


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_keys_cli_create_list_revoke_and_401(shared: Shared, pair: AuthPair) -> None:
    r = cli("create", "--name", "team-a", "--policies", "auto", "--rpm", "600", "--tpm", "200000", "--redis",
            shared.redis.url)
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    assert key.startswith("sk-sy-") and len(key) > 40
    # Stored hashed: the key itself is nowhere in Redis.
    dump = b"".join(v for v in shared.redis.client().hgetall("switchyard:keys").values())
    assert key.encode() not in dump and key[6:].encode() not in dump
    for url in (pair.e1_url, pair.e2_url):
        st, _, body = _post(url, chat(), key)
        assert st == 200, body
        st, _, body = _post(url, chat(), None)
        assert st == 401 and body["error"]["code"] == "missing_api_key"
        st, _, body = _post(url, chat(), key[:-2] + "xx")
        assert st == 401 and body["error"]["code"] == "invalid_api_key"
        assert http_get(url + "/v1/models")[0] == 401
    listed = cli("list", "--redis", shared.redis.url)
    assert "team-a" in listed.stdout and key not in listed.stdout and "active" in listed.stdout
    assert cli("revoke", "team-a", "--redis", shared.redis.url).returncode == 0
    for url in (pair.e1_url, pair.e2_url):  # every gateway refuses it within about a second
        wait_for(lambda u=url: _post(u, chat(), key)[0] == 401, 3, 0.1, "the revoked key to be refused")
        st, _, body = _post(url, chat(), key)
        assert st == 401 and "revoked" in body["error"]["message"]


def test_disallowed_policy_or_pool_is_403(pair: AuthPair) -> None:
    k = pair.keys
    st, _, body = _post(pair.e1_url, chat(), k["other-policy"])
    assert st == 403 and body["error"]["code"] == "model_not_allowed" and body["error"]["type"] == "permission_error"
    st, h, _ = _post(pair.e1_url, chat("easy"), k["small-only"])
    assert st == 200 and h["x-switchyard-pool"] == "small"
    st, _, body = _post(pair.e1_url, chat("a hard problem"), k["small-only"])  # routed to large
    assert st == 403 and body["error"]["code"] == "pool_not_allowed"
    st, _, body = _post(pair.e2_url, chat(model="large"), k["small-only"])  # direct
    assert st == 403
    st, _, _ = _post(pair.e2_url, chat(), k["auto-only"])
    assert st == 200
    st, _, body = _post(pair.e2_url, chat(model="small"), k["auto-only"])  # a pool by name is not `auto`
    assert st == 403
    st, _, _ = _post(pair.e2_url, chat(model="large"), k["open"])
    assert st == 200


def test_rpm_is_shared_across_gateways_and_429_has_retry_after(pair: AuthPair) -> None:
    key = pair.keys["rpm4"]
    # Stay clear of a minute boundary: the windows are whole minutes.
    if time.time() % 60 > 55:
        time.sleep(60 - time.time() % 60 + 0.2)
    for url in (pair.e1_url, pair.e1_url, pair.e2_url, pair.e2_url):
        st, _, body = _post(url, chat(), key)
        assert st == 200, body
        time.sleep(0.3)  # a few sync ticks: each gateway sees the other's count
    for url in (pair.e1_url, pair.e2_url):
        st, h, body = _post(url, chat(), key)
        assert st == 429, body
        assert body["error"]["code"] == "rate_limit_exceeded" and body["error"]["type"] == "requests"
        assert 1 <= int(h["Retry-After"]) <= 60
        assert h["x-ratelimit-limit-requests"] == "4"


def test_tpm_counts_upstream_usage_streams_included(pair: AuthPair) -> None:
    if time.time() % 60 > 55:
        time.sleep(60 - time.time() % 60 + 0.2)
    key = pair.keys["tpm40"]
    for _ in range(3):  # the upstream reports usage.total_tokens = 15 per answer: 45 >= 40 after three
        st, _, body = _post(pair.e1_url, chat(), key)
        assert st == 200, body
    time.sleep(0.3)  # a few sync ticks: e2 reads e1's tokens from the shared window
    st, h, body = _post(pair.e2_url, chat(), key)
    assert st == 429 and body["error"]["type"] == "tokens", body
    # The client asks for no usage in its streams; the gateway asks the upstream for it (and keeps
    # that chunk from the client), so stream tokens count from usage too: 15 a stream.
    skey = pair.keys["tpm-stream"]
    for _ in range(2):
        st, _, _ = _post(pair.e2_url, chat("x" * 120, stream=True), skey)
        assert st == 200
    metrics = admin_get(pair.e2_url + "/metrics")
    counted = [ln for ln in metrics.splitlines()
               if ln.startswith('switchyard_key_tokens_total{key="tpm-stream",source="usage"}')]
    assert counted and float(counted[0].split()[-1]) == 30.0, counted
    st, _, body = _post(pair.e2_url, chat(stream=True), skey)
    assert st == 429 and body["error"]["type"] == "tokens"
    usage = [ln for ln in admin_get(pair.e1_url + "/metrics").splitlines()
             if ln.startswith('switchyard_key_tokens_total{key="tpm40",source="usage"}')]
    assert usage and float(usage[0].split()[-1]) == 45.0


def test_keys_never_reach_logs_or_metrics(shared: Shared, pair: AuthPair) -> None:
    for k in pair.keys.values():
        _post(pair.e1_url, chat(), k)
    _post(pair.e1_url, chat(), "sk-sy-not-a-real-key-but-still-secret")
    text = admin_get(pair.e1_url + "/metrics") + admin_get(pair.e1_url + "/health")
    text += (shared.tmp / "gw-auth1.log").read_text() + (shared.tmp / "gw-auth2.log").read_text()
    for k in [*pair.keys.values(), "sk-sy-not-a-real-key-but-still-secret"]:
        assert k not in text and k[6:20] not in text
    assert 'switchyard_key_requests_total{key="open",outcome="admitted"}' in text


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_keys_file_without_redis(shared: Shared, tmp_path) -> None:
    """One gateway, no Redis: keys in a file (hashes only, mode 600), limits counted locally."""
    from procs import start_gateway

    keys_file = tmp_path / "keys.json"
    r = cli("create", "--name", "solo", "--rpm", "2", "--keys-file", str(keys_file))
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    assert key not in keys_file.read_text() and oct(keys_file.stat().st_mode & 0o777) == "0o600"
    gw, url = start_gateway(tmp_path, [shared.policy_b], "--auth", "--keys-file", str(keys_file), "--admin-key", ADMIN_KEY,
                           name="gw-file")
    try:
        if time.time() % 60 > 57:
            time.sleep(60 - time.time() % 60 + 0.2)
        assert _post(url, chat(), key)[0] == 200
        assert _post(url, chat(), key)[0] == 200
        st, h, body = _post(url, chat(), key)
        assert st == 429 and "Retry-After" in h and body["error"]["code"] == "rate_limit_exceeded"
        assert _post(url, chat(), "sk-sy-wrong")[0] == 401
        assert health(url)["auth"] == {"enabled": True, "store": str(keys_file), "keys": 1}
        assert cli("revoke", "solo", "--keys-file", str(keys_file)).returncode == 0
        wait_for(lambda: _post(url, chat(), key)[0] == 401, 3, 0.1, "the revoked key to be refused")
    finally:
        gw.stop()
