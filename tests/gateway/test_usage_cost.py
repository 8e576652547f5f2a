"""Tokens and cost: usage from upstream answers (streams included), prices per pool, the cost
header, the Prometheus counters, and the usage event a client did not ask for kept from it.

A gateway in front of two test upstreams (tests/fake_upstream.py), which answer OpenAI's way (a
usage-only chunk before [DONE] when stream_options.include_usage is set): in process
(tests/gateway/inproc.py), and for the cost of an answer also a real `switchyard serve` process.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import inproc
import orjson
import pytest
from procs import http_get, http_post, start_gateway, start_upstream

from switchyard.gateway.usage import Usage, UsageTap, parse_usage

POLICY = """
version: 1
name: priced
pools:
  small:
    model: small-model
    price: {{prompt: 0.1, completion: 0.4, cached: 0.025}}
    health: {{interval: 0}}
    replicas: [{{url: {s}/v1, name: s0}}]
  large:
    model: large-model
    price: {{prompt: 2.5, completion: 10}}
    stream_usage: false
    health: {{interval: 0}}
    replicas: [{{url: {l}/v1, name: l0}}]
routes:
  - {{name: hard, when: {{text: "(?i)hard"}}, pool: large}}
  - {{name: default, pool: small}}
"""


@dataclass
class Setup:
    """`post` and `scrape` reach the gateway (a process at `url`, or `inproc` in this one)."""

    ups: dict[str, str]  # name -> base URL
    url: str = ""
    inproc: inproc.Gateway | None = None

    def post(self, path: str, body: dict) -> tuple[int, dict[str, str], bytes]:
        if self.inproc is not None:
            r = self.inproc.post(path, content=orjson.dumps(body), headers={"Content-Type": "application/json"})
            return r.status_code, dict(r.headers), r.content
        return post(self.url + path, body)

    def scrape(self) -> str:
        if self.inproc is not None:
            return self.inproc.get("/metrics").text
        return http_get(self.url + "/metrics")[1].decode()

    def control(self, name: str, **kw) -> None:
        assert http_post(self.ups[name] + "/_control", orjson.dumps(kw))[0] == 200

    def upstream(self, name: str) -> dict:
        return orjson.loads(http_get(self.ups[name] + "/_state")[1])


@pytest.fixture(scope="module")
def setup(tmp_path_factory, request) -> Iterator[Setup]:
    """In process unless a test asks for "process" (indirect parametrization)."""
    tmp: Path = tmp_path_factory.mktemp("usage")
    policy = tmp / "priced.yaml"
    if getattr(request, "param", "inproc") == "process":
        procs = {n: start_upstream(tmp, n) for n in ("s0", "l0")}
        policy.write_text(POLICY.format(s=procs["s0"][1], l=procs["l0"][1]))
        gw, url = start_gateway(tmp, [policy])
        yield Setup({n: u for n, (_, u) in procs.items()}, url=url)
        gw.stop()
        for p, _ in procs.values():
            p.stop()
        return
    with inproc.stack() as s:
        ups = {n: s.upstream(n).url for n in ("s0", "l0")}
        policy.write_text(POLICY.format(s=ups["s0"], l=ups["l0"]))
        yield Setup(ups, inproc=s.gateway([policy]))


def post(url: str, body: dict) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line[len(name):line.rindex("}")]))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def scrape(s: Setup) -> str:
    return s.scrape()


def scrape_when(s: Setup, cond) -> str:
    """/metrics once `cond(text)` holds: a stream is counted when the upstream's stream ends."""
    deadline = time.monotonic() + 5
    while True:
        text = scrape(s)
        if cond(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def chat(text: str, **kw) -> dict:
    return {"model": "priced", "messages": [{"role": "user", "content": text}], **kw}


@pytest.mark.parametrize("setup", ["inproc", pytest.param("process", marks=pytest.mark.slow)], indirect=True)
def test_cost_header_and_counters_for_an_answer(setup: Setup) -> None:
    setup.control("s0", cached_tokens=4)
    try:
        before = scrape(setup)
        status, h, _ = setup.post("/v1/chat/completions", chat("hello"))
    finally:
        setup.control("s0", cached_tokens=0)
    assert status == 200 and h["x-switchyard-pool"] == "small"
    # 10 prompt tokens (4 of them cached) and 5 completion tokens at 0.1 / 0.025 / 0.4 USD per million.
    expected = (6 * 0.1 + 4 * 0.025 + 5 * 0.4) / 1e6
    assert float(h["x-switchyard-cost-usd"]) == pytest.approx(expected, abs=1e-9)
    after = scrape(setup)
    for kind, n in (("prompt", 10), ("completion", 5), ("cached", 4)):
        got = metric(after, "switchyard_tokens_total", policy="priced", pool="small", kind=kind)
        was = metric(before, "switchyard_tokens_total", policy="priced", pool="small", kind=kind)
        assert got - was == n, kind
    cost = metric(after, "switchyard_cost_usd_total", policy="priced", pool="small")
    assert cost - metric(before, "switchyard_cost_usd_total", policy="priced", pool="small") == pytest.approx(expected)
    assert metric(after, "switchyard_price_usd_per_million_tokens", policy="priced", pool="large",
                  kind="cached") == 2.5  # no cached price: the prompt price


def test_stream_usage_is_asked_for_and_kept_from_a_client_that_did_not(setup: Setup) -> None:
    body = chat("count", stream=True)
    before = scrape(setup)
    status, h, through = setup.post("/v1/chat/completions", body)
    assert status == 200
    sent = setup.upstream("s0")["last_body"]
    assert sent["stream_options"] == {"include_usage": True}  # the gateway asked upstream
    # What the client got is byte for byte what the upstream sends a client that did not ask.
    _, _, direct = post(setup.ups["s0"] + "/v1/chat/completions", {**body, "model": "small-model"})
    assert through == direct and b'"usage"' not in through and through.endswith(b"data: [DONE]\n\n")
    assert h["x-switchyard-price"].startswith("prompt=0.1; completion=0.4; cached=0.025")
    assert "x-switchyard-cost-usd" not in h  # headers leave before the usage exists
    after = scrape_when(setup, lambda t: metric(t, "switchyard_tokens_total", pool="small", kind="completion")
                        > metric(before, "switchyard_tokens_total", pool="small", kind="completion"))
    assert metric(after, "switchyard_tokens_total", pool="small", kind="completion") - \
        metric(before, "switchyard_tokens_total", pool="small", kind="completion") == 5
    assert metric(after, "switchyard_cost_usd_total", pool="small") - \
        metric(before, "switchyard_cost_usd_total", pool="small") == pytest.approx((10 * 0.1 + 5 * 0.4) / 1e6)


def test_stream_usage_a_client_asked_for_reaches_it(setup: Setup) -> None:
    body = chat("count", stream=True, stream_options={"include_usage": True})
    before = scrape(setup)
    _, _, through = setup.post("/v1/chat/completions", body)
    events = [orjson.loads(line[6:]) for line in through.split(b"\n\n") if line.startswith(b"data: {")]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] == 15
    after = scrape_when(setup, lambda t: metric(t, "switchyard_tokens_total", pool="small", kind="prompt")
                        > metric(before, "switchyard_tokens_total", pool="small", kind="prompt"))
    assert metric(after, "switchyard_tokens_total", pool="small", kind="prompt") - \
        metric(before, "switchyard_tokens_total", pool="small", kind="prompt") == 10


def test_a_pool_that_opts_out_gets_the_clients_body(setup: Setup) -> None:
    before = scrape(setup)
    _, h, through = setup.post("/v1/chat/completions", chat("a hard one", stream=True))
    assert h["x-switchyard-pool"] == "large"
    assert "stream_options" not in setup.upstream("l0")["last_body"]
    assert b'"usage"' not in through
    # No usage in the stream: nothing to count (never a guess in switchyard_tokens_total).
    assert metric(scrape(setup), "switchyard_tokens_total", pool="large") == \
        metric(before, "switchyard_tokens_total", pool="large")


def test_usage_parsing_and_the_tap() -> None:
    final = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},'
             b'"finish_reason":"stop"}]}\n\n')
    usage = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":31,'
             b'"completion_tokens":12,"total_tokens":43,"prompt_tokens_details":{"cached_tokens":8}}}\n\n')
    done = b"data: [DONE]\n\n"
    assert parse_usage(final + usage + done) == Usage(31, 12, 8)
    assert parse_usage(b'{"usage": {"prompt_tokens": 7, "completion_tokens": 2}}') == Usage(7, 2, 0)
    assert parse_usage(b'{"usage": {"total_tokens": 9}}') == Usage(9, 0, 0)
    assert parse_usage(b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n') is None
    # A model writing the word in its content cannot forge a usage object (JSON escapes quotes).
    assert parse_usage(b'{"choices":[{"message":{"content":"\\"usage\\": {\\"prompt_tokens\\": 99}"}}],'
                       b'"usage":{"prompt_tokens":3,"completion_tokens":1}}') == Usage(3, 1, 0)
    assert parse_usage(b'{"usage": null}') is None

    class _Content:
        def __init__(self, chunks: list[bytes]):
            self.chunks = chunks

        async def readany(self) -> bytes:
            return self.chunks.pop(0) if self.chunks else b""

    class _Resp:
        def __init__(self, chunks: list[bytes]):
            self.content = _Content(chunks)

    async def relay(tap: UsageTap, first: bytes) -> bytes:
        out = [tap.feed(first)]
        while b := await tap.content.readany():
            out.append(b)
        return b"".join(out)

    body = b"data: {}\n\n" * 300
    stream = body + final + usage + done
    for cut in (len(body) + 20, len(body) + len(final) + 10, len(stream) - 5):
        chunks = [stream[10:cut], stream[cut:]]
        # Kept for a client that asked: every byte passes; dropped otherwise, and only that event.
        tap = UsageTap(_Resp(list(chunks)), drop_usage_event=False)
        assert asyncio.run(relay(tap, stream[:10])) == stream and tap.usage() == Usage(31, 12, 8)
        tap = UsageTap(_Resp(list(chunks)), drop_usage_event=True)
        assert asyncio.run(relay(tap, stream[:10])) == body + final + done and tap.usage() == Usage(31, 12, 8)
    # A stream without usage: an estimate (the prompt's, and one token an event).
    tap = UsageTap(_Resp([b"data: {}\n\n" * 4, done]), drop_usage_event=True)
    assert asyncio.run(relay(tap, b"data: {}\n\n")) == b"data: {}\n\n" * 5 + done
    assert tap.usage() is None and tap.estimate(10) == 10 + 5
