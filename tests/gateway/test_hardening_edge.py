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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest
from procs import ROOT, Proc, free_port, start_gateway

LIVE_MS = 100.0  # /health/live's worst answer while a bad input is handled
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
    with live(gurl) as probe:
        t0 = time.perf_counter()
        r = httpx.post(gurl + "/v1/chat/completions", json=BODY, timeout=60, trust_env=False)
        took = time.perf_counter() - t0
    assert r.status_code == 200 and r.content == bomb.encode()  # relayed as it came, with no usage read
    assert took < 2, took
    assert probe.worst < LIVE_MS, probe.worst


# --- 8. an SSE event that never ends --------------------------------------------------------


def test_an_endless_upstream_event_ends_the_stream_with_an_error_event(edge):
    url, gurl, gw = edge
    control(url, mode="endless_event", total_mb=128)
    before = httpx.get(gurl + "/metrics", trust_env=False).text
    with live(gurl) as probe:
        t0 = time.perf_counter()
        with httpx.stream("POST", gurl + "/v1/chat/completions", json={**BODY, "stream": True}, timeout=60,
                          trust_env=False) as r:
            got = b"".join(r.iter_bytes())
        took = time.perf_counter() - t0
    assert r.status_code == 200
    # At most the cap (1 MB) of the event went out, then OpenAI's error event, then the end.
    assert len(got) < 1.2 * (1 << 20), len(got)
    tail = got[got.rfind(b"data: "):]
    err = orjson.loads(tail[6:])["error"]
    assert "larger than 1048576 bytes" in err["message"] and "--max-event-mb" in err["message"], err
    assert took < 5, took  # was: the first byte after 42-103 s
    assert probe.worst < LIVE_MS, probe.worst
    after = httpx.get(gurl + "/metrics", trust_env=False).text
    assert metric(after, "switchyard_requests_total", code="502") == \
        metric(before, "switchyard_requests_total", code="502") + 1


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
