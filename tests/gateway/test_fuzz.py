"""Thousands of random and mutated request bodies and headers against a running gateway: never a
5xx from the gateway itself, never a hang, memory bounded.

The thousands go to a real `switchyard serve` process (slow), its HTTP server included and its RSS
checked after; a few hundred run in process for the inner loop (tests/gateway/inproc.py: the app
under ASGITransport, a real upstream socket). Generating the cases costs most of either."""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import inproc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from procs import start_gateway, start_upstream

VALID = {
    "model": "auto",
    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in Paris?"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "1", "content": "sunny"}],
    "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
    "metadata": {"session_id": "s1"},
    "max_tokens": 8,
    "stream": False,
}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=5)), max_leaves=30)


def _paths(v, prefix=()):
    yield prefix
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, (*prefix, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, (*prefix, i))


ALL_PATHS = [p for p in _paths(VALID) if p]


@st.composite
def mutated(draw):
    """A valid request with a few of its values replaced by anything, or deleted."""
    body = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(ALL_PATHS))
        parent = body
        try:
            for k in path[:-1]:
                parent = parent[k]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue
    return body


header_names = st.sampled_from(["x-session-id", "content-type", "x-canary", "origin", "authorization",
                                "accept", "x-whatever", "host"])
header_values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60).map(str.strip)


def _policy(tmp: Path, url: str) -> Path:
    pol = tmp / "p.yaml"
    pol.write_text(f"version: 1\nname: p\npools:\n  small:\n    model: m\n    replicas: [{{url: '{url}/v1'}}]\n"
                   "session: {pin: pool}\nroutes:\n  - {name: canary, when: {header.x-canary: '1', text: 'a+b'}, "
                   "pool: small}\n  - {name: default, pool: small}\n")
    return pol


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """In process: `post` has httpx.Client.post's shape."""
    with inproc.stack() as s:
        up = s.upstream("u")
        yield s.gateway([_policy(tmp_path_factory.mktemp("fuzz"), up.url)])


@pytest.fixture(scope="module")
def real_gateway(tmp_path_factory):
    tmp: Path = tmp_path_factory.mktemp("fuzz-real")
    up, url = start_upstream(tmp, "u")
    gw, gurl = start_gateway(tmp, [_policy(tmp, url)])
    client = httpx.Client(base_url=gurl, timeout=10, trust_env=False)
    rss = [_rss_kb(gw.p.pid)]
    yield client, gw, rss
    client.close()
    gw.stop()
    up.stop()


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()["error"]  # OpenAI's envelope, always
        assert isinstance(err["message"], str) and err["type"]


def fuzz(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])


bodies = st.one_of(mutated(), json_values)
paths = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/route"])
headers = st.dictionaries(header_names, header_values, max_size=4)


def _bodies(post, body, path) -> None:
    _check(post(path, json=body))


def _headers_and_bytes(post, headers, raw) -> None:
    _check(post("/v1/chat/completions", json=VALID, headers=headers))
    _check(post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"}))


@fuzz(300)
@given(body=bodies, path=paths)
def test_random_and_mutated_bodies(gateway, body, path):
    _bodies(gateway.post, body, path)


@fuzz(100)
@given(headers=headers, raw=st.binary(max_size=300))
def test_random_headers_and_bytes(gateway, headers, raw):
    _headers_and_bytes(gateway.post, headers, raw)


@pytest.mark.slow
@fuzz(1200)
@given(body=bodies, path=paths)
def test_random_and_mutated_bodies_real_process(real_gateway, body, path):
    _bodies(real_gateway[0].post, body, path)


@pytest.mark.slow
@fuzz(400)
@given(headers=headers, raw=st.binary(max_size=300))
def test_random_headers_and_bytes_real_process(real_gateway, headers, raw):
    _headers_and_bytes(real_gateway[0].post, headers, raw)


@pytest.mark.slow
def test_memory_stayed_bounded(real_gateway):
    client, gw, rss = real_gateway
    assert gw.p.poll() is None
    assert _rss_kb(gw.p.pid) - rss[0] < 100_000, (rss[0], _rss_kb(gw.p.pid))


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0
