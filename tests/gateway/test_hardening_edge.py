"""Hardening, third round (issue 28), the edge's findings: one body never freezes the gateway, and a
tenant stays in its lane. Every probe is a real gateway process on loopback, in front of a real
upstream process (tests/edge_upstream.py where the upstream must misbehave), with a real client.

While the worst inputs are refused, a thread asks /health/live every 10 ms: the event loop must
answer each time within 100 ms.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import httpx
import orjson
import pytest
from procs import ROOT, Proc, free_port, start_gateway

LIVE_MS = 100.0  # /health/live's worst answer while a bad input is handled
T = TypeVar("T")
BODY = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}


def start_edge_upstream(tmp: Path, name: str = "edge") -> tuple[Proc, str]:
    port = free_port()
    proc = Proc([sys.executable, str(ROOT / "tests" / "edge_upstream.py"), "--port", str(port)],
                f"http://127.0.0.1:{port}/health", tmp / f"{name}.log")
    return proc, f"http://127.0.0.1:{port}"


def control(url: str, **cfg) -> None:
    httpx.post(url + "/_control", json=cfg, timeout=5, trust_env=False).raise_for_status()


def policy(url: str, name: str = "p", extra: str = "") -> str:
    return (f"version: 1\nname: {name}\npools:\n  small:\n    model: m\n{extra}"
            f"    replicas: [{{url: '{url}/v1'}}]\nroutes:\n  - {{name: default, pool: small}}\n")


class LiveProbe:
    """/health/live asked every 10 ms from a thread: the worst time to an answer, in ms."""

    def __init__(self, url: str):
        self.url = url
        self.worst = 0.0
        self.n = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(trust_env=False, timeout=30) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                r = c.get(self.url + "/health/live")
                ms = (time.perf_counter() - t0) * 1000
                assert r.status_code == 200
                self.worst = max(self.worst, ms)
                self.n += 1
                time.sleep(0.01)

    def __enter__(self) -> LiveProbe:
        self._t.start()
        time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)
        self._stop.set()
        self._t.join()


@contextmanager
def live(url: str) -> Iterator[LiveProbe]:
    with LiveProbe(url) as p:
        yield p
    assert p.n > 0


def during(url: str, action: Callable[[], T], tries: int = 3) -> tuple[T, float]:
    """`action()` with /health/live probed meanwhile: (its result, the probe's worst ms). The
    machine is shared: a run whose worst is over LIVE_MS is tried again (up to `tries` runs), so
    a neighbour's burst does not fail the test, while a stall of the gateway's own shows every time."""
    for _ in range(tries):
        with live(url) as probe:
            out = action()
        if probe.worst < LIVE_MS:
            break
    return out, probe.worst


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    """A misbehaving upstream and an open-mode gateway in front of it."""
    tmp = tmp_path_factory.mktemp("edge")
    up, url = start_edge_upstream(tmp)
    pol = tmp / "p.yaml"
    pol.write_text(policy(url))
    gw, gurl = start_gateway(tmp, [pol])
    yield url, gurl, gw
    gw.stop()
    up.stop()


def _chunk(text: str) -> str:
    return "data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "model": "m",
                                    "choices": [{"index": 0, "delta": {"content": text}}]}).decode() + "\n\n"


STREAM = [_chunk(w) for w in ("one ", "two ", "three ", "four ", "five")] + ["data: [DONE]\n\n"]


# --- 7. usage parsing of a non-stream body is linear and bounded -------------------------


def test_an_answer_built_to_stall_usage_parsing_does_not_freeze_the_loop(edge):
    url, gurl, gw = edge
    # 128 KB after "usage": every '}' a candidate end, each tried by counting braces again
    # (quadratic): this froze the loop 15-28 s.
    n = 22_000
    bomb = ('{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
            '"content":"hi"},"finish_reason":"stop"}],"usage":' + '{"a":' * n + "1" + "}" * n + "}")
    assert len(bomb) > 128_000
    control(url, mode="json", body=bomb)

    def send() -> tuple[httpx.Response, float]:
        t0 = time.perf_counter()
        return httpx.post(gurl + "/v1/chat/completions", json=BODY, timeout=60, trust_env=False), \
            time.perf_counter() - t0

    (r, took), worst = during(gurl, send)
    assert r.status_code == 200 and r.content == bomb.encode()  # relayed as it came, with no usage read
    assert took < 2, took
    assert worst < LIVE_MS, worst


# --- 8. an SSE event that never ends --------------------------------------------------------


def test_an_endless_upstream_event_ends_the_stream_with_an_error_event(edge):
    url, gurl, gw = edge
    control(url, mode="endless_event", total_mb=128)
    before = httpx.get(gurl + "/metrics", trust_env=False).text
    runs = []

    def send() -> tuple[httpx.Response, bytes, float]:
        runs.append(1)
        t0 = time.perf_counter()
        with httpx.stream("POST", gurl + "/v1/chat/completions", json={**BODY, "stream": True}, timeout=60,
                          trust_env=False) as r:
            got = b"".join(r.iter_bytes())
        return r, got, time.perf_counter() - t0

    (r, got, took), worst = during(gurl, send)
    assert r.status_code == 200
    # At most the cap (1 MB) of the event went out, then OpenAI's error event, then the end.
    assert len(got) < 1.2 * (1 << 20), len(got)
    tail = got[got.rfind(b"data: "):]
    err = orjson.loads(tail[6:])["error"]
    assert "larger than 1048576 bytes" in err["message"] and "--max-event-mb" in err["message"], err
    assert took < 5, took  # was: the first byte after 42-103 s
    assert worst < LIVE_MS, worst
    after = httpx.get(gurl + "/metrics", trust_env=False).text
    assert metric(after, "switchyard_requests_total", code="502") == \
        metric(before, "switchyard_requests_total", code="502") + len(runs)


@pytest.mark.slow  # a socket's timing against a real process: `make test`
def test_a_long_event_is_relayed_as_it_comes(edge):
    url, gurl, gw = edge
    # One 40 KB event written in 8 pieces, 150 ms apart: the client has bytes long before its end
    # (it was held back whole while the gateway looked for the usage-only chunk).
    head = 'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"'
    pieces = [head] + ["y" * 5000] * 8 + ['"}}]}\n\n', "data: [DONE]\n\n"]
    control(url, mode="stream", framing="chunked", events=pieces, delay_ms=150)
    t0 = time.perf_counter()
    first = None
    with httpx.stream("POST", gurl + "/v1/chat/completions", json={**BODY, "stream": True}, timeout=30,
                      trust_env=False) as r:
        got = []
        for b in r.iter_raw():
            if first is None and b"y" in b:
                first = time.perf_counter() - t0
            got.append(b)
    total = time.perf_counter() - t0
    body = b"".join(got)
    assert body == "".join(pieces).encode()
    assert first is not None and first < total - 0.5, (first, total)


# --- 21. a close-delimited stream cut midway -----------------------------------------------


def test_a_close_delimited_stream_cut_midway_ends_with_an_error_event(edge):
    url, gurl, gw = edge
    import openai

    client = openai.OpenAI(base_url=gurl + "/v1", api_key="none", http_client=httpx.Client(trust_env=False))
    # Whole, with no framing: the connection's end is the body's end, and [DONE] came: clean.
    control(url, mode="stream", framing="close", events=STREAM)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="auto", messages=BODY["messages"], stream=True) if c.choices)
    assert text == "one two three four five"
    before = httpx.get(gurl + "/metrics", trust_env=False).text
    # Cut after two chunks: the same clean end of the connection, but no [DONE]: the client must
    # see a failure, not a short answer.
    control(url, mode="stream", framing="close", events=STREAM, cut_after=2)
    seen = []
    with pytest.raises(openai.APIError) as e:
        for c in client.chat.completions.create(model="auto", messages=BODY["messages"], stream=True):
            seen.extend(ch.delta.content or "" for ch in c.choices)
    assert "".join(seen) == "one two "
    assert "stopped before its final event" in str(e.value), e.value
    after = httpx.get(gurl + "/metrics", trust_env=False).text
    assert metric(after, "switchyard_requests_total", code="502") == \
        metric(before, "switchyard_requests_total", code="502") + 1


# --- 1. bound work, not only bytes -----------------------------------------------------------


def _msgs(n: int) -> list[dict]:
    return [{"role": "user", "content": "x"}] * n


WORST_BODIES = {
    # name: (body, the limit the 400 names)
    "5M empty arrays (15 MB)": (b'{"model":"auto","messages":[{"role":"user","content":"x"}],"x":['
                                + b"[]," * 4_999_999 + b"[]]}", "--max-body-containers"),
    "400k messages (12 MB)": (orjson.dumps({"model": "auto", "messages": _msgs(400_000)}), "--max-body-containers"),
    "5M-deep nesting (10 MB)": (b'{"model":"auto","messages":[{"role":"user","content":"x"}],"x":'
                                + b"[" * 5_000_000 + b"]" * 5_000_000 + b"}", "--max-body-containers"),
    "4M strings (16 MB)": (orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": ["a"] * 3_900_000}]}),
                           "--max-body-items"),
    "12k messages": (orjson.dumps({"model": "auto", "messages": _msgs(12_000)}), "--max-messages"),
    "60k content parts": (orjson.dumps({"model": "auto", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "x"}] * 60_000}]}), "--max-content-parts"),
    "1,500 tools": (orjson.dumps({"model": "auto", "messages": _msgs(1), "tools": [
        {"type": "function", "function": {"name": f"t{i}"}} for i in range(1500)]}), "--max-tools"),
    "300-deep nesting": (b'{"model":"auto","messages":[{"role":"user","content":"x"}],"x":'
                         + b"[" * 300 + b"]" * 300 + b"}", "nested deeper than 200"),
}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The well-behaved test upstream and an open-mode gateway."""
    from procs import start_upstream

    tmp = tmp_path_factory.mktemp("plain")
    up, url = start_upstream(tmp, "u")
    pol = tmp / "p.yaml"
    pol.write_text(policy(url))
    gw, gurl = start_gateway(tmp, [pol])
    yield url, gurl, gw
    gw.stop()
    up.stop()


@pytest.mark.parametrize("name", list(WORST_BODIES))
def test_the_worst_bodies_are_refused_without_freezing_the_loop(plain, name):
    url, gurl, gw = plain
    raw, limit = WORST_BODIES[name]

    def send() -> tuple[httpx.Response, float]:
        t0 = time.perf_counter()
        r = httpx.post(gurl + "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"},
                       timeout=60, trust_env=False)
        return r, time.perf_counter() - t0

    (r, took), worst = during(gurl, send)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert limit in err["message"] and err["type"] == "invalid_request_error", err
    assert worst < LIVE_MS, (name, worst, took)


def test_large_bodies_within_the_limits_still_go_through(plain):
    url, gurl, gw = plain
    # 10 MB of one string, and 2 MB of code whose 300k brackets sit inside strings (the counting's
    # bound is over the limit, the exact count is not): both served, the loop free meanwhile.
    big = {"model": "auto", "messages": [{"role": "user", "content": "y" * 10_000_000}]}
    code = {"model": "auto", "messages": [{"role": "user", "content": "f(a[i], {k: v}) " * 150_000}]}
    for body in (big, code):
        raw = orjson.dumps(body)
        r, worst = during(gurl, lambda raw=raw: httpx.post(gurl + "/v1/chat/completions", content=raw, timeout=60,
                                                           headers={"Content-Type": "application/json"},
                                                           trust_env=False))
        assert r.status_code == 200, r.text[:300]
        assert worst < LIVE_MS, worst


# --- keys: 3, 4, 10, 13 -------------------------------------------------------------------------

ADMIN = "sk-admin-edge-test"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """Two policies that both have a pool `small` (premium loaded first), a slow streaming upstream
    for each, and keys limited in policy, pool, rpm and tpm, on one gateway with --auth."""
    import asyncio

    from switchyard.gateway.keys import FileKeyStore, make_key

    tmp = tmp_path_factory.mktemp("keyed")
    up_p, url_p = start_edge_upstream(tmp, "premium-up")
    up_c, url_c = start_edge_upstream(tmp, "cheap-up")
    up_j, url_j = start_edge_upstream(tmp, "judge-up")  # an llm classifier's pool: it counts the calls
    control(url_j, mode="json", body=orjson.dumps({
        "id": "j", "object": "chat.completion", "model": "judge",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "simple"}, "finish_reason": "stop"}],
    }).decode())
    slow = [_chunk(f"w{i} ") for i in range(20)] + ["data: [DONE]\n\n"]
    for u, who in ((url_p, "premium"), (url_c, "cheap")):
        control(u, mode="stream", framing="chunked", events=[_chunk(who + " ")] + slow, delay_ms=40)
    (tmp / "a-premium.yaml").write_text(
        "version: 1\nname: premium\npools:\n"
        f"  small:\n    model: premium-small\n    replicas: [{{url: '{url_p}/v1'}}]\n"
        f"  large:\n    model: premium-large\n    replicas: [{{url: '{url_p}/v1'}}]\n"
        "routes:\n  - {name: default, pool: large}\n")
    (tmp / "b-cheap.yaml").write_text(
        "version: 1\nname: cheap\npools:\n"
        f"  small:\n    model: cheap-small\n    replicas: [{{url: '{url_c}/v1'}}]\n"
        "routes:\n  - {name: default, pool: small}\n")
    (tmp / "c-graded.yaml").write_text(
        "version: 1\nname: graded\nclassifier: {kind: llm, pool: judge, timeout: 5s}\npools:\n"
        f"  judge:\n    model: judge\n    replicas: [{{url: '{url_j}/v1'}}]\n"
        f"  small:\n    model: graded-small\n    replicas: [{{url: '{url_c}/v1'}}]\n"
        "routes:\n  - {name: default, pool: small}\n")
    keys_file = tmp / "keys.json"
    specs = {"cheap-small": (["cheap"], ["small"], None, None), "tpm": (None, None, None, 1000),
             "rpm3": (["graded"], None, 3, None), "open": (None, None, None, None)}
    keys: dict[str, str] = {}

    async def put_all() -> None:
        store = FileKeyStore(keys_file)
        for name, (pol, pools, rpm, tpm) in specs.items():
            key, rec = make_key(name, pol, pools, rpm, tpm)
            keys[name] = key
            await store.put(rec)
        await store.aclose()

    asyncio.run(put_all())
    gw, gurl = start_gateway(tmp, [tmp / "a-premium.yaml", tmp / "b-cheap.yaml", tmp / "c-graded.yaml"],
                             "--auth", "--keys-file", str(keys_file), "--admin-key", ADMIN)
    yield gurl, keys, (url_p, url_c, url_j)
    gw.stop()
    for up in (up_p, up_c, up_j):
        up.stop()


def _stream_text(gurl: str, key: str, body: dict) -> tuple[int, dict, str]:
    with httpx.stream("POST", gurl + "/v1/chat/completions", json={**body, "stream": True}, timeout=30,
                      headers={"Authorization": f"Bearer {key}"}, trust_env=False) as r:
        return r.status_code, dict(r.headers), "".join(r.iter_text())


def _wait_minute_clear() -> None:
    if time.time() % 60 > 50:  # the windows are whole minutes: start a test well inside one
        time.sleep(60 - time.time() % 60 + 0.2)


@pytest.mark.slow  # seconds of waiting or load by design: `make test`
def test_a_pool_name_resolves_within_the_keys_own_policies(keyed):
    gurl, keys, _ = keyed
    k = keys["cheap-small"]
    # `small` names premium's pool first (premium loads first); this key is limited to `cheap`:
    # it is cheap's small that serves it, never premium's.
    st, h, text = _stream_text(gurl, k, {"model": "small", "messages": BODY["messages"]})
    assert st == 200 and h["x-switchyard-policy"] == "cheap" and h["x-switchyard-pool"] == "small", h
    assert "cheap " in text and "premium" not in text
    for model in ("premium-small", "premium-large", "large", "premium"):  # the other policy's names
        st, _, text = _stream_text(gurl, k, {"model": model, "messages": BODY["messages"]})
        assert st == 403 and "permission_error" in text, (model, st, text)
    st, h, _ = _stream_text(gurl, k, {"model": "auto", "messages": BODY["messages"]})  # its own first policy
    assert st == 200 and h["x-switchyard-policy"] == "cheap"
    # An open key still gets the first policy's pool, as the name has always meant.
    st, h, text = _stream_text(gurl, keys["open"], {"model": "small", "messages": BODY["messages"]})
    assert st == 200 and h["x-switchyard-policy"] == "premium" and "premium " in text


def test_models_and_route_show_a_key_what_it_may_use(keyed, plain):
    gurl, keys, (url_p, url_c, _) = keyed
    auth = {"Authorization": f"Bearer {keys['cheap-small']}"}
    ids = {m["id"]: m["switchyard"] for m in
           httpx.get(gurl + "/v1/models", headers=auth, trust_env=False).json()["data"]}
    assert set(ids) == {"auto", "cheap", "small", "cheap-small"}, ids
    assert all(m["policy"] == "cheap" for m in ids.values())
    everything = httpx.get(gurl + "/v1/models", headers={"Authorization": f"Bearer {keys['open']}"},
                           trust_env=False).json()["data"]
    assert {"premium", "premium-large", "large", "graded"} <= {m["id"] for m in everything}
    # /v1/route: the decision, but replica URLs, health and in-flight counts only for the operator.
    r = httpx.post(gurl + "/v1/route", json={"model": "small", "messages": BODY["messages"]}, headers=auth,
                   trust_env=False)
    assert r.status_code == 200 and r.json()["policy"] == "cheap"
    assert "replicas" not in r.json() and url_c.split("//")[1] not in r.text
    # Open mode without an admin key (loopback only): the operator is whoever is there, as for /health.
    up_url, open_gurl, _ = plain
    r = httpx.post(open_gurl + "/v1/route", json=BODY, trust_env=False)
    assert r.status_code == 200 and r.json()["replicas"][0]["url"] == up_url + "/v1", r.json()


def test_route_counts_against_rpm_and_refusals_cost_no_classifier_call(keyed):
    gurl, keys, (_, _, judge) = keyed
    _wait_minute_clear()

    def judged() -> int:
        return httpx.get(judge + "/_state", trust_env=False).json()["served"]

    k = {"Authorization": f"Bearer {keys['rpm3']}", "x-session-id": "s1"}
    body = {"model": "graded", "messages": BODY["messages"]}
    n0 = judged()
    codes = [httpx.post(gurl + "/v1/route", json=body, headers=k, trust_env=False).status_code for _ in range(3)]
    assert codes == [200, 200, 200] and judged() == n0 + 3  # each dry run asked the llm classifier
    r = httpx.post(gurl + "/v1/route", json=body, headers=k, trust_env=False)
    assert r.status_code == 429 and r.json()["error"]["type"] == "requests", r.text  # /v1/route is counted
    r = httpx.post(gurl + "/v1/chat/completions", json=body, headers=k, trust_env=False)
    assert r.status_code == 429
    # A key refused for its policy: 403 before any classifier call (and any session write) too.
    r = httpx.post(gurl + "/v1/chat/completions", json=body,
                   headers={"Authorization": f"Bearer {keys['cheap-small']}"}, trust_env=False)
    assert r.status_code == 403
    assert judged() == n0 + 3  # the refused requests cost the upstream nothing


# --- 3. tpm: reserved at admission, charged from the parsed body, settled at the end -----------


def _tokens(gurl: str, key_name: str) -> float:
    text = httpx.get(gurl + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, trust_env=False).text
    return metric(text, "switchyard_key_tokens_total", key=key_name)


@pytest.mark.slow  # seconds of waiting or load by design: `make test`
def test_concurrent_streams_cannot_overspend_the_tpm(keyed):
    gurl, keys, _ = keyed
    _wait_minute_clear()
    import asyncio

    async def one(c: httpx.AsyncClient) -> int:
        async with c.stream("POST", gurl + "/v1/chat/completions",
                            json={"model": "cheap", "messages": BODY["messages"], "stream": True, "max_tokens": 100},
                            headers={"Authorization": f"Bearer {keys['tpm']}"}) as r:
            async for _ in r.aiter_bytes():
                pass
            return r.status_code

    async def all20() -> list[int]:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as c:
            return await asyncio.gather(*(one(c) for _ in range(20)))

    before = _tokens(gurl, "tpm")
    codes = asyncio.run(all20())
    spent = _tokens(gurl, "tpm") - before
    # Each reserves its prompt and max_tokens (~102): about nine fit in 1000 at once; the rest 429.
    # Before, all 20 ran (each saw the window empty) and spent 20x what each did.
    assert codes.count(200) <= 10 and codes.count(429) >= 10, codes
    assert spent <= 1000, spent
    r = httpx.post(gurl + "/v1/chat/completions", json={"model": "cheap", "messages": BODY["messages"]},
                   headers={"Authorization": f"Bearer {keys['tpm']}"}, trust_env=False)
    assert r.status_code in (200, 429)


def test_a_chunked_body_is_charged_its_prompt_and_a_hang_up_settles(keyed):
    gurl, keys, _ = keyed
    # 6,000 characters: a prompt of 1,500 tokens, sent without a Content-Length.
    prompt = "z" * 6000
    raw = orjson.dumps({"model": "cheap", "messages": [{"role": "user", "content": prompt}], "stream": True})

    def chunks() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
        for i in range(0, len(raw), 1000):
            yield raw[i:i + 1000]

    before = _tokens(gurl, "open")
    with httpx.stream("POST", gurl + "/v1/chat/completions", content=chunks(), timeout=30, trust_env=False,
                      headers={"Authorization": f"Bearer {keys['open']}", "Content-Type": "application/json"}) as r:
        assert r.status_code == 200 and "content-length" not in r.request.headers
        got = 0
        for b in r.iter_raw():  # hang up after the first events
            got += b.count(b"data:")
            if got >= 2:
                break
    deadline = time.time() + 5
    while _tokens(gurl, "open") == before and time.time() < deadline:
        time.sleep(0.05)
    charged = _tokens(gurl, "open") - before
    # The prompt from the parsed body (was 0: no Content-Length), and one token an event that went by.
    assert 1500 <= charged <= 1500 + 22, charged


def test_a_cut_stream_reaches_a_messages_client_as_its_error_event(edge):
    url, gurl, gw = edge
    import anthropic

    # The chat upstream's stream is cut after two chunks (no framing, no [DONE]); the gateway
    # translates it for an Anthropic client, which must see Anthropic's error event, not a
    # message_stop after "one two ".
    control(url, mode="stream", framing="close", events=STREAM, cut_after=2)
    client = anthropic.Anthropic(base_url=gurl, api_key="none", max_retries=0, timeout=30)
    seen = []
    with pytest.raises(anthropic.APIError) as e, client.messages.stream(
            model="auto", max_tokens=50, messages=[{"role": "user", "content": "hi"}]) as s:
        for text in s.text_stream:
            seen.append(text)
    assert "".join(seen) == "one two "
    assert "stopped before its final event" in str(e.value), e.value


def test_the_exact_count_ignores_brackets_in_strings_across_windows():
    """api/body.py's count against a walk of the parsed value, on bodies whose strings hold
    brackets, commas, quotes and backslashes and cross the 16 KB windows (escapes split at a
    window's edge included): exact whenever the bound is over the limit, never a false refusal."""
    import random

    from switchyard import errors
    from switchyard.api import body as B

    rnd = random.Random(28)
    atoms = ["a[b", 'x"{,', "\\", '\\"', "", 1, None, "[[[,,,{{{"]

    def gen(d: int = 0):
        r = rnd.random()
        if d > 5 or r < 0.4:
            return rnd.choice(atoms + ["\\" * rnd.randint(1, 5) + "q" * rnd.randint(0, 40_000)])
        if r < 0.7:
            return [gen(d + 1) for _ in range(rnd.randint(0, 5))]
        return {f"k{j},[": gen(d + 1) for j in range(rnd.randint(0, 5))}

    def walk(v) -> int:
        n, stack = 0, [v]
        while stack:
            x = stack.pop()
            if isinstance(x, dict | list):
                n += 1
                stack.extend(x.values() if isinstance(x, dict) else x)
        return n

    for _ in range(200):
        v = gen()
        raw = orjson.dumps(v)
        n = walk(v)
        B.count(raw, B.BodyLimits(max_containers=n, max_items=10**9))  # exactly at the limit: passes
        if n:
            with pytest.raises(errors.BadRequest, match="arrays and objects"):
                B.count(raw, B.BodyLimits(max_containers=n - 1, max_items=10**9))
