"""Bad input against a real gateway, in one run: how much was tried, the slowest refusal, the
gateway's memory peak, and any 5xx of its own (there must be none).

    python bench/hardening.py                    # ~3.8k inputs, about a minute on 2 shared cores
    python bench/hardening.py --scale 0.3        # fewer of the generated ones
    python bench/hardening.py --out bench/results/hardening.json

One gateway process (open mode, loopback, short slow-client timeouts so that part stays short)
in front of the fast test upstream (tests/fake_upstream.py). The generated bodies and headers
are those of tests/gateway/test_fuzz.py (hypothesis, generate phase only, a fixed seed); the
rest are written here: deep JSON, huge and malformed headers, huge bodies, alias-bomb and
backtracking-regex policies through the UI, and slow clients (silent, trickling, unfinished
bodies, clients that stop reading a stream). Every input is sent alone (sequentially), so a
refusal's time is its own, on a machine that may be loaded: read the slowest as an upper bound.
A background probe of /health/live shows whether the event loop ever stalled.

Issue 28's kinds: work bombs (bodies of millions of empty arrays, 400k messages), and upstream
misbehaviour through a pool `bad` whose replica is tests/bad_upstream.py (a URL with credentials,
a pool key set through a YAML merge key): redirects, HTML and control bytes in Content-Type,
gzip, echoed keys, 200s that are errors, answers of 256 MB, Set-Cookie, an SSE event that never
ends, a stream cut without framing, a big answer without usage, and policy edits through the UI
(${ENV} of a variable nobody allowed, 200k YAML nodes). Each upstream probe has an oracle: what
a correct gateway does (a 502 in the API's shape, no leak, no followed redirect); the run counts
the wrong answers.

    python bench/hardening.py --tree /tmp/before --out bench/results/hardening_before.json
                                                 # the gateway of another checkout (the bench's
                                                 # own probes and upstreams from this one)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import socket
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from procs import Proc, free_port, start_gateway, start_upstream  # noqa: E402 - the tests' process helpers


def _load_fuzz() -> Any:
    # test_fuzz.py imports its neighbours (inproc, gwkit) as the gateway tests' conftest allows.
    if str(ROOT / "tests" / "gateway") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests" / "gateway"))
    spec = importlib.util.spec_from_file_location("hardening_fuzz", ROOT / "tests" / "gateway" / "test_fuzz.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SLOW_KINDS = frozenset({"slow: silent socket", "slow: trickled headers", "slow: unfinished body",
                        "slow: stopped reading"})


POLICY_REFUSED = "200, policy refused"  # the UI's validate and preview answer 200 with the issues


@dataclass
class Outcome:
    kind: str
    label: str
    status: int | str  # an HTTP status, or what happened instead: POLICY_REFUSED, closed, cut, hang, error
    ms: float
    peak_raise_kb: int  # how much the gateway's VmHWM rose by the time this input was answered
    t_end: float = 0.0  # perf_counter when it was answered (which input was in flight when the loop stalled)


@dataclass
class Tally:
    pid: int
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hwm: int = 0

    def add(self, kind: str, label: str, status: int | str, ms: float) -> None:
        with self.lock:
            hwm = mem_kb(self.pid).get("VmHWM", self.hwm)
            self.outcomes.append(Outcome(kind, label, status, ms, max(0, hwm - self.hwm), time.perf_counter()))
            self.hwm = max(self.hwm, hwm)


def refused(o: Outcome) -> bool:
    """A refusal: a 4xx, a policy the UI refused, or a connection the gateway cut."""
    return (isinstance(o.status, int) and 400 <= o.status < 500) or o.status in (POLICY_REFUSED, "closed", "cut")


def _policy_refused(path: str, r: httpx.Response) -> bool:
    if r.status_code != 200 or not path.startswith("/ui/api/policies/"):
        return False
    body = r.json()
    return body.get("ok") is False if path.endswith("/validate") else bool(body.get("issues")) and "edited" not in body


# --- senders ------------------------------------------------------------------------------


def send_http(t: Tally, c: httpx.Client, kind: str, label: str, method: str, path: str, *,
              content: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 15.0) -> None:
    t0 = time.perf_counter()
    try:
        r = c.request(method, path, content=content, headers=headers, timeout=timeout)
        status: int | str = POLICY_REFUSED if _policy_refused(path, r) else r.status_code
        if r.status_code >= 500:
            label = f"{label} -> {r.text[:200]}"
    except httpx.TimeoutException:
        status = "hang"
    except httpx.RemoteProtocolError:
        status = "closed"
    except (httpx.HTTPError, OSError) as e:
        status, label = "error", f"{label} ({type(e).__name__}: {e})"
    t.add(kind, label, status, (time.perf_counter() - t0) * 1000)


def send_raw(t: Tally, port: int, kind: str, label: str, data: bytes, timeout: float = 15.0) -> None:
    """Raw bytes on a fresh connection; the status of what comes back, or how the gateway ended it."""
    t0 = time.perf_counter()
    status: int | str
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            try:
                s.sendall(data)
            except OSError:
                pass  # the gateway may answer (431, 413) and close before it has read everything
            head = s.recv(64)
            status = int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else "closed"
    except TimeoutError:
        status = "hang"
    except ConnectionResetError:
        status = "closed"
    t.add(kind, label, status, (time.perf_counter() - t0) * 1000)


def json_post(t: Tally, c: httpx.Client, kind: str, label: str, path: str, body: bytes) -> None:
    send_http(t, c, kind, label, "POST", path, content=body, headers={"content-type": "application/json"})


# --- hand-made inputs ---------------------------------------------------------------------


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def alias_bomb(levels: int, width: int = 9) -> str:
    lines = ["version: 1", f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    lines.append("pools: {small: {model: s, replicas: [{url: 'http://127.0.0.1:9/v1'}]}}")
    lines.append(f"routes: [{{name: d, pool: small, when: {{text: *a{levels - 1}}}}}]")
    return "\n".join(lines) + "\n"


def regex_policy(pattern: str) -> str:
    return ("version: 1\nname: p\npools: {small: {model: m, replicas: [{url: 'http://127.0.0.1:9/v1'}]}}\n"
            f"routes:\n  - {{name: r, when: {{text: {json.dumps(pattern)}}}, pool: small}}\n"
            "  - {name: default, pool: small}\n")


BAD_REGEXES = ["(a+)+$", "(a|aa)*c", "(a*)*b", "(.*a){20}", "(a|a)*$", "([a-z]+)*x", "(a)\\1", "(?=a)a",
               "(?<=a)b", "[", "a{1000000}", "(?P<n>a)(?P=n)", "((((((((((a*)*)*)*)*)*)*)*)*)*)*y"]


def handmade(t: Tally, c: httpx.Client, port: int, policy: str, scale: float) -> None:
    valid = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}
    # Deep JSON: around the limit (200), the encoder's (254), the parser's (1024), far beyond.
    for depth in (199, 201, 254, 255, 300, 1023, 1025, 5000, 100_000):
        body = orjson.dumps(valid)[:-1] + b', "metadata": {"x": ' + nested(depth) + b"}}"
        for path in ("/v1/chat/completions", "/v1/route"):
            json_post(t, c, "deep JSON", f"{path} depth {depth}", path, body)
        ui = (b'{"name": "p", "text": ' + orjson.dumps(policy) + b', "request": {"messages": [{"role": "user", '
              b'"content": "x"}], "metadata": {"x": ' + nested(depth) + b"}}}")
        json_post(t, c, "deep JSON", f"UI preview depth {depth}", "/ui/api/policies/preview", ui)
        json_post(t, c, "deep JSON", f"UI login depth {depth}", "/ui/api/login", b'{"key": ' + nested(depth) + b"}")
    # Huge and malformed headers, on raw connections (an HTTP client would refuse to send most).
    req = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    body = orjson.dumps(valid)
    cl = b"Content-Length: %d\r\n" % len(body)
    heads: list[tuple[str, bytes]] = [
        ("one 70 KB header", req + b"X-Big: " + b"a" * 70_000 + b"\r\n" + cl + b"\r\n" + body),
        ("one 1 MB header", req + b"X-Big: " + b"a" * 1_000_000 + b"\r\n" + cl + b"\r\n" + body),
        ("2000 small headers", req + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 30) for i in range(2000)) + cl
         + b"\r\n" + body),
        ("a 100 KB URL", b"GET /health?" + b"q" * 100_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
        ("a 60 KB session id", req + b"X-Session-Id: " + b"s" * 60_000 + b"\r\n" + cl + b"\r\n" + body),
        ("NUL in a header", req + b"X-Bad: a\x00b\r\n" + cl + b"\r\n" + body),
        ("no colon in a header", req + b"NoColonHere\r\n" + cl + b"\r\n" + body),
        ("two Content-Lengths", req + cl + b"Content-Length: 3\r\n\r\n" + body),
        ("Content-Length -1", req + b"Content-Length: -1\r\n\r\n" + body),
        ("Content-Length abc", req + b"Content-Length: abc\r\n\r\n" + body),
        ("Content-Length 10^30", req + b"Content-Length: " + b"9" * 30 + b"\r\n\r\n" + body),
        ("bad chunk size", req + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"),
        ("chunked and Content-Length", req + b"Transfer-Encoding: chunked\r\n" + cl + b"\r\n5\r\nhello\r\n0\r\n\r\n"),
        ("not HTTP", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(200)),
        ("HTTP/0.9", b"GET /health\r\n\r\n"),
        ("bad method", b"FOO\x01 /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
        ("bad version", b"GET /health HTTP/7.3\r\nHost: 127.0.0.1\r\n\r\n"),
        ("absolute URL to elsewhere", b"GET http://evil.example/health HTTP/1.1\r\nHost: evil.example\r\n\r\n"),
        ("path traversal", b"GET /ui/static/../../../../etc/passwd HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
        ("encoded traversal", b"GET /ui/static/..%2f..%2fpyproject.toml HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
        ("rebound Host", b"POST /v1/chat/completions HTTP/1.1\r\nHost: attacker.example\r\nContent-Type: "
         b"application/json\r\n" + cl + b"\r\n" + body),
        ("foreign Origin on a write", req + b"Origin: http://attacker.example\r\n" + cl + b"\r\n" + body),
    ]
    for label, data in heads:
        for _ in range(max(1, round(3 * scale))):
            send_raw(t, port, "headers", label, data)
    # Huge bodies: announced (413 before reading) and unannounced (counted as they arrive).
    send_raw(t, port, "huge body", "300 MB announced on /v1", req + b"Content-Length: 314572800\r\n\r\n"
             + b"x" * 65536)
    send_raw(t, port, "huge body", "300 MB announced on the UI login",
             b"POST /ui/api/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 314572800\r\n\r\n" + b"x" * 65536)

    def chunks(total: int, piece: int = 256 * 1024):
        for _ in range(total // piece):
            yield b"x" * piece

    for path, total in (("/v1/chat/completions", 20 << 20), ("/ui/api/policies/validate", 4 << 20),
                        ("/ui/api/login", 2 << 20)):
        t0 = time.perf_counter()
        try:
            r = c.post(path, content=chunks(total), headers={"content-type": "application/json"}, timeout=30)
            status: int | str = r.status_code
        except httpx.HTTPError:
            status = "closed"
        t.add("huge body", f"{total >> 20} MB unannounced on {path}", status, (time.perf_counter() - t0) * 1000)
    # Alias bombs through the UI (validate, preview and apply: the running policy must stay).
    for levels in (5, 7, 8, 9, 12):
        bomb = alias_bomb(levels)
        for route in ("validate", "preview", "apply"):
            payload: dict[str, Any] = {"name": "p", "text": bomb}
            if route == "preview":
                payload["request"] = valid
            json_post(t, c, "alias bomb", f"{levels} levels via {route}", f"/ui/api/policies/{route}",
                      orjson.dumps(payload))
    # Backtracking and unsupported regexes, in a policy and in the preview's request.
    evil_text = "a" * 50_000 + "!"
    for pattern in BAD_REGEXES:
        text = regex_policy(pattern)
        json_post(t, c, "bad regex", f"{pattern!r} via validate", "/ui/api/policies/validate",
                  orjson.dumps({"name": "p", "text": text}))
        req_body = {"model": "auto", "messages": [{"role": "user", "content": evil_text}]}
        json_post(t, c, "bad regex", f"{pattern!r} via preview on 50 KB of 'a'", "/ui/api/policies/preview",
                  orjson.dumps({"name": "p", "text": text, "request": req_body}))
    # The running policy's own regex ('a+b') against text made to backtrack.
    for n in (10_000, 100_000, 1_000_000):
        send_http(t, c, "bad regex", f"running 'a+b' on {n} x 'a' with x-canary", "POST", "/v1/route",
                  content=orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "a" * n}]}),
                  headers={"content-type": "application/json", "x-canary": "1"})
    # Other UI and admin abuse.
    for label, path, raw in (
        ("login with a 900 KB key", "/ui/api/login", orjson.dumps({"key": "k" * 900_000})),
        ("login, body a list", "/ui/api/login", b"[1, 2, 3]"),
        ("validate, text not a string", "/ui/api/policies/validate", b'{"name": "p", "text": {"a": 1}}'),
        ("validate, 900 KB of YAML", "/ui/api/policies/validate",
         orjson.dumps({"name": "p", "text": "a: [" + "1, " * 300_000 + "1]\n"})),
        ("validate, YAML tags", "/ui/api/policies/validate",
         orjson.dumps({"name": "p", "text": "!!python/object/apply:os.system ['true']\n"})),
        ("preview, no request", "/ui/api/policies/preview", orjson.dumps({"name": "p", "text": policy})),
        ("preview, headers a list", "/ui/api/policies/preview",
         orjson.dumps({"name": "p", "text": policy, "request": valid, "headers": [1]})),
        ("apply, unknown policy name", "/ui/api/policies/apply", orjson.dumps({"name": "../../etc", "text": policy})),
    ):
        json_post(t, c, "UI abuse", label, path, raw)
    send_http(t, c, "UI abuse", "form-encoded login", "POST", "/ui/api/login", content=b"key=x",
              headers={"content-type": "application/x-www-form-urlencoded"})
    send_http(t, c, "UI abuse", "report path traversal", "GET", "/ui/reports/..%2f..%2f/etc%2fpasswd")
    send_http(t, c, "UI abuse", "admin API without a key", "POST", "/admin/reload")


# --- generated inputs (tests/gateway/test_fuzz.py's strategies) -----------------------------


def generated(t: Tally, c: httpx.Client, scale: float, seed: int) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed
    from hypothesis import strategies as st

    fz = _load_fuzz()

    def run(n: int, strategy: Any, send: Callable[..., None]) -> None:
        @fixed_seed(seed)
        @settings(max_examples=max(1, int(n * scale)), deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def go(x: Any) -> None:
            send(x)

        go()

    paths = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/route"])

    def body_sender(kind: str) -> Callable[[Any], None]:
        def send(x: tuple[Any, str]) -> None:
            body, path = x
            raw = json.dumps(body).encode()  # not orjson: the strategies make integers past 64 bits
            json_post(t, c, kind, f"{path} {raw[:160].decode(errors='replace')}", path, raw)
        return send

    run(2000, st.tuples(fz.mutated(), paths), body_sender("mutated body"))
    run(600, st.tuples(fz.json_values, paths), body_sender("random JSON"))

    def send_bytes(raw: bytes) -> None:
        json_post(t, c, "random bytes", repr(raw[:80]), "/v1/chat/completions", raw)

    run(500, st.binary(max_size=300), send_bytes)
    valid = orjson.dumps(fz.VALID)

    def send_headers(h: dict[str, str]) -> None:
        send_http(t, c, "random headers", repr(h)[:160], "POST", "/v1/chat/completions", content=valid,
                  headers={"content-type": "application/json", **h})

    run(500, st.dictionaries(fz.header_names, fz.header_values, max_size=4), send_headers)


# --- slow clients, all at once ----------------------------------------------------------------


def slow_clients(t: Tally, port: int, upstream: str, n: int) -> dict[str, Any]:
    """Silent sockets, headers a byte at a time, bodies that never finish, clients that stop
    reading a stream: each should be cut after its timeout (2 s here), never held."""
    httpx.post(upstream + "/_control", json={"stream_chunks": 10_000, "chunk_pad": 4000, "chunk_delay_ms": 1},
               timeout=5, trust_env=False)
    before = httpx.get(upstream + "/_state", timeout=5, trust_env=False).json()["cancelled"]

    def until_closed(kind: str, label: str, s: socket.socket, t0: float, limit: float = 30.0) -> None:
        """The time to the gateway's answer (a 408), or to its closing the connection."""
        s.settimeout(limit)
        status: int | str = "closed"
        try:
            head = s.recv(64)
            if head.startswith(b"HTTP/1.1 "):
                status = int(head.split()[1])
        except TimeoutError:
            status = "hang"
        except ConnectionResetError:
            pass
        finally:
            s.close()
        t.add(kind, label, status, (time.perf_counter() - t0) * 1000)

    def silent() -> None:
        t0 = time.perf_counter()
        until_closed("slow: silent socket", "connect and say nothing",
                     socket.create_connection(("127.0.0.1", port)), t0)

    def trickle() -> None:
        t0 = time.perf_counter()
        s = socket.create_connection(("127.0.0.1", port))
        try:
            for b in b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n":
                s.sendall(bytes([b]))
                time.sleep(0.2)
        except OSError:
            pass
        until_closed("slow: trickled headers", "a header byte every 200 ms", s, t0)

    def unfinished() -> None:
        t0 = time.perf_counter()
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"mod")
        until_closed("slow: unfinished body", "5 of 100 body bytes, then nothing", s, t0)

    def stop_reading() -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": True})
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        # Not a byte read for 6 s (the stall timeout is 2 s; the stream lasts 10 s or more), then
        # read it all: a stream the gateway cut ends early, without its [DONE].
        time.sleep(6)
        t0 = time.perf_counter()
        s.settimeout(60)
        got, tail = 0, b""
        status: int | str = "cut"
        try:
            while chunk := s.recv(1 << 16):
                got += len(chunk)
                tail = (tail + chunk)[-64:]
        except TimeoutError:
            status = "hang"
        except ConnectionResetError:
            pass
        finally:
            s.close()
        if status == "cut" and b"[DONE]" in tail:
            status = "completed"  # not cut: the stall went unnoticed
        t.add("slow: stopped reading", f"a 40 MB stream, not read for 6 s: {got / 1e6:.1f} MB came", status,
              6000 + (time.perf_counter() - t0) * 1000)

    threads = []
    for fn, count in ((silent, n), (trickle, n), (unfinished, n), (stop_reading, max(1, n // 2))):
        threads += [threading.Thread(target=fn) for _ in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    state = httpx.get(upstream + "/_state", timeout=5, trust_env=False).json()
    deadline = time.monotonic() + 10
    while state["inflight"] and time.monotonic() < deadline:
        time.sleep(0.1)
        state = httpx.get(upstream + "/_state", timeout=5, trust_env=False).json()
    httpx.post(upstream + "/_control", json={"stream_chunks": 5, "chunk_pad": 0, "chunk_delay_ms": 0}, timeout=5,
               trust_env=False)
    return {"upstream_cancelled": state["cancelled"] - before, "upstream_inflight_after": state["inflight"]}


# --- issue 28: work bombs and upstream misbehaviour -------------------------------------------

POOL_KEY = "sk-probe-pool-key-0123456789abcdef"
URL_SECRET = "pw-probe-secret-42"


def work_bombs(t: Tally, c: httpx.Client, scale: float) -> None:
    """Bodies cheap in bytes and dear in work (finding 1): each should be a quick 400."""
    head = b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "metadata": {"x": ['
    for n in (1_000_000, 5_000_000):
        body = head + b",".join([b"[]"] * n) + b"]}}"
        json_post(t, c, "work bomb", f"{n:,} empty arrays ({len(body) >> 20} MB)", "/v1/chat/completions", body)
    for n in (100_000, 400_000):
        msgs = b",".join([b'{"role":"user","content":"x"}'] * n)
        json_post(t, c, "work bomb", f"{n:,} messages", "/v1/chat/completions",
                  b'{"model": "auto", "messages": [' + msgs + b"]}")
    parts = b",".join([b'{"type":"text","text":"x"}'] * 400_000)
    json_post(t, c, "work bomb", "400,000 content parts", "/v1/chat/completions",
              b'{"model": "auto", "messages": [{"role": "user", "content": [' + parts + b"]}]}")
    tools = b",".join(b'{"type":"function","function":{"name":"f%d","parameters":{}}}' % i for i in range(50_000))
    json_post(t, c, "work bomb", "50,000 tools", "/v1/chat/completions",
              b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], "tools": [' + tools + b"]}")


@dataclass
class Probe:
    kind: str
    label: str
    steer: dict[str, Any]  # the bad upstream's behaviour (tests/bad_upstream.py /_control)
    check: Callable[[httpx.Response | None, dict[str, Any]], str | None]  # -> what was wrong, or None
    stream: bool = False


def _ok_502(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if r is None:
        return "the connection was dropped"
    if r.status_code < 500:
        return f"relayed as {r.status_code}, not an upstream error"
    try:
        r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return "the error is not in the API's shape"
    return None


def _no_secret(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if r is None:
        return "the connection was dropped"
    text = r.text + json.dumps(dict(r.headers))
    for s in (POOL_KEY, URL_SECRET):
        if s in text:
            return f"{s[:12]}... relayed to the client"
    return None


def _safe_type(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if r is None:
        return "the connection was dropped"
    ctype = r.headers.get("content-type", "")
    if not ctype.startswith(("application/json", "text/event-stream", "text/plain")):
        return f"relayed with Content-Type {ctype!r}"
    if r.headers.get("x-content-type-options") != "nosniff":
        return "no x-content-type-options: nosniff"
    return None


def _decoded(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if r is None:
        return "the connection was dropped"
    if r.status_code != 200:
        return f"status {r.status_code}"
    try:
        r.json()
    except ValueError:
        return "the body is not JSON (gzip bytes without their Content-Encoding)"
    return None


def _not_followed(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if ctx["stolen"]:
        return "the redirect was followed (the body re-sent to its target)"
    return _ok_502(r, ctx)


def _bounded(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if ctx["rss_raise_mb"] > 100:
        return f"gateway RSS rose {ctx['rss_raise_mb']:.0f} MB"
    return _ok_502(r, ctx)


def _stream_ends_in_error(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if r is None:
        return "the connection was dropped without an error event"
    if r.status_code >= 500:
        return _ok_502(r, ctx)
    body = ctx.get("stream_text", "")
    if "[DONE]" in body and "error" not in body:
        return None if ctx.get("expect_done") else "a cut stream ended as if complete"
    if '"error"' not in body:
        return "the stream ended without an error event (looks complete to the client)"
    if ctx["rss_raise_mb"] > 100:
        return f"gateway RSS rose {ctx['rss_raise_mb']:.0f} MB"
    return None


def _quick(limit_ms: float) -> Callable[[httpx.Response | None, dict[str, Any]], str | None]:
    def check(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
        if r is None:
            return "the connection was dropped"
        if ctx["ms"] > limit_ms:
            return f"took {ctx['ms']:.0f} ms"
        return None
    return check


def _all(*checks: Callable[[httpx.Response | None, dict[str, Any]], str | None]):
    def check(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
        return next((p for c in checks if (p := c(r, ctx)) is not None), None)
    return check


JSON_H = [["Content-Type", "application/json"]]
SSE_H = [["Content-Type", "text/event-stream"]]
ANSWER = ('{{"id":"x","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant",'
          '"content":"{}"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":3,"completion_tokens":1,'
          '"total_tokens":4}}}}')


def upstream_probes() -> list[Probe]:
    probes = [Probe("upstream: redirect", f"{code} to /stolen", {
        "status": code, "headers": [["Location", "/stolen"], ["Content-Type", "application/json"]], "body": "{}"},
        _not_followed) for code in (301, 302, 307, 308)]
    probes += [
        Probe("upstream: content type", "200 text/html <script>", {
            "headers": [["Content-Type", "text/html"]], "body": "<script>alert(1)</script>"}, _safe_type),
        Probe("upstream: content type", "404 text/html", {
            "status": 404, "headers": [["Content-Type", "text/html"]], "body": "<h1>no</h1>"}, _safe_type),
        Probe("upstream: content type", "200 application/javascript", {
            "headers": [["Content-Type", "application/javascript"]], "body": "alert(1)"}, _safe_type),
        Probe("upstream: content type", "DEL byte in Content-Type", {
            "headers": [["Content-Type", "application/json\x7f"]]}, _safe_type),
        Probe("upstream: content type", "control bytes in Content-Type", {
            "headers": [["Content-Type", "application/json; x=\x01\x1b"]]}, _safe_type),
        Probe("upstream: gzip", "gzip answer", {"gzip": True}, _decoded),
        Probe("upstream: echoed key", "400 echoing Authorization", {"status": 400, "echo_auth": True}, _no_secret),
        Probe("upstream: echoed key", "422 echoing Authorization", {"status": 422, "echo_auth": True}, _no_secret),
        Probe("upstream: echoed key", "200 whose text holds the key", {
            "body": ANSWER.format("key " + POOL_KEY)}, _no_secret),
        Probe("upstream: echoed key", "stream whose text holds the key", {
            "headers": SSE_H, "body": 'data: {"choices":[{"index":0,"delta":{"content":"' + POOL_KEY
            + '"}}]}\n\ndata: [DONE]\n\n'}, _no_secret, stream=True),
        Probe("upstream: 200 error", "200 {error}", {
            "body": '{"error": {"message": "overloaded", "type": "server_error"}}'}, _ok_502),
        Probe("upstream: 200 error", "200 Anthropic-style error", {
            "body": '{"type": "error", "error": {"type": "overloaded_error", "message": "x"}}'}, _ok_502),
        Probe("upstream: 200 error", "stream whose first event is an error", {
            "headers": SSE_H, "body": 'data: {"error": {"message": "overloaded"}}\n\n'}, _ok_502, stream=True),
        Probe("upstream: huge answer", "256 MB JSON answer", {"pad_bytes": 256 << 20}, _bounded),
        Probe("upstream: endless event", "64 MB SSE event without an end", {
            "headers": SSE_H, "pad_bytes": 64 << 20}, _stream_ends_in_error, stream=True),
        Probe("upstream: cut stream", "stream without framing cut after 2 events", {
            "headers": SSE_H, "close_framing": True, "cut_at": 160,
            "body": 'data: {"choices":[{"index":0,"delta":{"content":"one"}}]}\n\n' * 4 + "data: [DONE]\n\n"},
            _stream_ends_in_error, stream=True),
        Probe("upstream: big answer, no usage", "128 KB answer without usage", {
            "body": '{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
                    '"content":"' + "{" * (128 * 1024) + '"},"finish_reason":"stop"}]}'}, _quick(2000)),
        Probe("upstream: big answer, no usage", "128 KB of nested objects, no usage", {
            "body": '{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"pad":['
                    + ",".join(['{"a":{"b":{}}}'] * 9000) + "]}"}, _quick(2000)),
    ]
    return probes


def start_bad_upstream(tmp: Path) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc([sys.executable, str(ROOT / "tests" / "bad_upstream.py"), "--port", str(port)],
                f"http://127.0.0.1:{port}/health", tmp / "bad-upstream.log")
    return proc, f"http://127.0.0.1:{port}"


def upstream_misbehaviour(t: Tally, c: httpx.Client, bad: str, policy: str) -> dict[str, Any]:
    """Each probe: steer the bad upstream, send one request to pool `bad`, judge the answer."""
    wrong: list[dict[str, Any]] = []
    by_kind: Counter = Counter()

    def steer(**cfg: Any) -> None:
        httpx.post(bad + "/_control", json=cfg, timeout=5, trust_env=False).raise_for_status()

    def bad_state() -> dict[str, Any]:
        return httpx.get(bad + "/_state", timeout=5, trust_env=False).json()

    body = {"model": "bad", "messages": [{"role": "user", "content": "hi"}]}
    for p in upstream_probes():
        steer(**p.steer)
        stolen0 = bad_state()["stolen"]
        rss0 = mem_kb(t.pid)["VmRSS"]
        ctx: dict[str, Any] = {}
        t0 = time.perf_counter()
        r: httpx.Response | None
        try:
            if p.stream:
                with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as resp:
                    chunks = []
                    for chunk in resp.iter_bytes():
                        if sum(map(len, chunks)) < 1 << 20:
                            chunks.append(chunk)
                    resp._content = b"".join(chunks)  # at most the first MB, for .text and .json()
                    r = resp
                    ctx["stream_text"] = resp._content.decode("utf-8", "replace")
            else:
                r = c.post("/v1/chat/completions", json=body, timeout=60)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            r = None
        except httpx.TimeoutException:
            r = None
            ctx["hang"] = True
        ms = (time.perf_counter() - t0) * 1000
        ctx.update(ms=ms, stolen=bad_state()["stolen"] - stolen0,
                   rss_raise_mb=(mem_kb(t.pid)["VmRSS"] - rss0) / 1024)
        problem = p.check(r, ctx)
        status: int | str = r.status_code if r is not None else ("hang" if ctx.get("hang") else "closed")
        t.add(p.kind, p.label, status, ms)
        by_kind[p.kind] += 1
        if problem is not None:
            wrong.append({"kind": p.kind, "input": p.label, "status": status, "wrong": problem})
    steer()
    # Cookies: one tenant's Set-Cookie must not ride along on the next request.
    steer(headers=[*JSON_H, ["Set-Cookie", "tenant=alice; Path=/"]])
    t0 = time.perf_counter()
    r1 = c.post("/v1/chat/completions", json=body, headers={"x-session-id": "alice"})
    steer()
    c.post("/v1/chat/completions", json=body, headers={"x-session-id": "bob"})
    t.add("upstream: cookie", "Set-Cookie then another tenant", r1.status_code, (time.perf_counter() - t0) * 1000)
    if "cookie" in bad_state()["last_headers"]:
        wrong.append({"kind": "upstream: cookie", "input": "Set-Cookie then another tenant", "status": r1.status_code,
                      "wrong": "the upstream's cookie was sent with another tenant's request"})
    # Credentials of the replica URL and the pool key, wherever the gateway shows replicas.
    creds = {**body, "model": "creds"}
    r1 = c.post("/v1/chat/completions", json=creds)
    steer(status=503, body='{"error": {"message": "down"}}')
    r2 = c.post("/v1/chat/completions", json=creds)
    steer()
    for label, resp in (("x-switchyard-* headers", r1), ("an upstream failure's message", r2),
                        ("/v1/route", c.post("/v1/route", json=creds)),
                        ("/health", c.get("/health")), ("/metrics", c.get("/metrics")),
                        ("/ui/api/policies", c.get("/ui/api/policies"))):
        t.add("upstream: credentials shown", label, resp.status_code, 0.0)
        problem = _no_secret(resp, {})
        if problem is None and "agent:" in resp.text + json.dumps(dict(resp.headers)) and label != "/ui/api/policies":
            problem = "the URL's user name is shown"
        if problem is not None:
            wrong.append({"kind": "upstream: credentials shown", "input": label, "status": resp.status_code,
                          "wrong": problem})
    # Policy edits: a ${NAME} nobody allowed, and 200k YAML nodes, through the UI's apply.
    env_text = policy.replace("    model: m\n", "    model: m\n    api_key: '${HOME}'\n", 1)
    t0 = time.perf_counter()
    r = c.post("/ui/api/policies/apply", json={"name": "p", "text": env_text}, timeout=30)
    t.add("UI: ${ENV}", "apply with api_key ${HOME}", r.status_code, (time.perf_counter() - t0) * 1000)
    if r.status_code == 200:
        wrong.append({"kind": "UI: ${ENV}", "input": "apply with api_key ${HOME}", "status": 200,
                      "wrong": "applied: the gateway's $HOME would go to the pool's upstream"})
        c.post("/ui/api/policies/apply", json={"name": "p", "text": policy}, timeout=30)
    flat = "version: 1\nx: [" + ",".join("1" for _ in range(200_000)) + "]\n"
    t0 = time.perf_counter()
    r = c.post("/ui/api/policies/apply", json={"name": "p", "text": flat}, timeout=60)
    ms = (time.perf_counter() - t0) * 1000
    t.add("UI: apply", "200,000 YAML nodes", r.status_code, ms)
    if ms > 5000:
        wrong.append({"kind": "UI: apply", "input": "200,000 YAML nodes", "status": r.status_code,
                      "wrong": f"took {ms / 1000:.1f} s"})
    return {"tried": sum(by_kind.values()) + 9, "wrong": wrong}  # + cookie, 6 places, 2 UI edits


# --- the edge's kinds (issue 28: 1, 3, 4, 10, 13) ------------------------------------------------


def edge_bombs(t: Tally, c: httpx.Client) -> None:
    """The rest of finding 1's limits, each should be a quick 400 naming its limit: values (4M
    strings), depth (5M levels; 300), messages (12k), content parts (60k), tools (1,500), and a
    body whose brackets sit in strings (within the limits: a 200)."""
    m = b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "x": '
    bodies = {
        "3.9M strings (16 MB)": orjson.dumps({"model": "auto", "messages": [
            {"role": "user", "content": ["a"] * 3_900_000}]}),
        "5M-deep nesting (10 MB)": m + b"[" * 5_000_000 + b"]" * 5_000_000 + b"}",
        "300-deep nesting": m + b"[" * 300 + b"]" * 300 + b"}",
        "12,000 messages": orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "x"}] * 12_000}),
        "60,000 content parts": orjson.dumps({"model": "auto", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x"}] * 60_000}]}),
        "1,500 tools": orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "x"}], "tools": [
            {"type": "function", "function": {"name": f"t{i}"}} for i in range(1500)]}),
        "2 MB of code, 300k brackets in strings (fine)": orjson.dumps({"model": "auto", "messages": [
            {"role": "user", "content": "f(a[i], {k: v}) " * 150_000}]}),
    }
    for label, body in bodies.items():
        json_post(t, c, "work bomb", label, "/v1/chat/completions", body)


def _tokens_of(text: str, key: str) -> float:
    pre = f'switchyard_key_tokens_total{{key="{key}",'
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(pre))


def tenant_lanes(t: Tally, tmp: Path, tree: Path) -> dict[str, Any]:
    """A keyed gateway (--auth) in front of two policies that both have a pool `small` (premium
    loads first) and a streaming upstream that reports no usage (tests/edge_upstream.py): does a
    key stay in its lane (finding 4), see only what it may use (13), get counted on /v1/route and
    refused before any classifier call (10), and stay within its tpm (3)?"""
    import asyncio

    from switchyard.gateway.keys import FileKeyStore, make_key

    port = free_port()
    up = Proc([sys.executable, str(ROOT / "tests" / "edge_upstream.py"), "--port", str(port)],
              f"http://127.0.0.1:{port}/health", tmp / "edge-upstream.log")
    url = f"http://127.0.0.1:{port}"
    chunk = 'data: {"choices":[{"index":0,"delta":{"content":"w "}}]}\n\n'
    httpx.post(url + "/_control", json={"mode": "stream", "framing": "chunked", "delay_ms": 20,
                                        "events": [chunk] * 50 + ["data: [DONE]\n\n"]}, trust_env=False)
    (tmp / "a-premium.yaml").write_text(
        f"version: 1\nname: premium\npools:\n  small:\n    model: premium-small\n    replicas: [{{url: '{url}/v1'}}]\n"
        f"  large:\n    model: premium-large\n    replicas: [{{url: '{url}/v1'}}]\nroutes:\n  - {{name: d, pool: large}}\n")
    (tmp / "b-cheap.yaml").write_text(
        f"version: 1\nname: cheap\npools:\n  small:\n    model: cheap-small\n    replicas: [{{url: '{url}/v1'}}]\n"
        "routes:\n  - {name: d, pool: small}\n")
    keys_file = tmp / "keys.json"
    keys: dict[str, str] = {}

    async def put() -> None:
        store = FileKeyStore(keys_file)
        for name, pol, pools, rpm, tpm in (("cheap-small", ["cheap"], ["small"], None, None),
                                           ("rpm3", ["cheap"], None, 3, None), ("tpm1000", None, None, None, 1000),
                                           ("open", None, None, None, None)):
            keys[name], rec = make_key(name, pol, pools, rpm, tpm)
            await store.put(rec)
        await store.aclose()

    asyncio.run(put())
    admin = "sk-bench-admin"
    gw, gurl = start_gateway(tmp, [tmp / "a-premium.yaml", tmp / "b-cheap.yaml"], "--auth", "--keys-file",
                             str(keys_file), "--admin-key", admin, "--no-watch", name="gw-keyed", cwd=tree)
    wrong: list[dict[str, Any]] = []
    figures: dict[str, Any] = {}

    def h(name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[name]}"}

    def post(kind: str, label: str, path: str, body: dict, key: str, want: Callable[[httpx.Response], str | None],
             **kw: Any) -> httpx.Response:
        t0 = time.perf_counter()
        r = c.post(path, json=body, headers=h(key), **kw)
        t.add(kind, label, r.status_code, (time.perf_counter() - t0) * 1000)
        problem = want(r)
        if problem is not None:
            wrong.append({"kind": kind, "input": label, "status": r.status_code, "wrong": problem})
        return r

    msgs = [{"role": "user", "content": "hi"}]
    try:
        if time.time() % 60 > 45:  # rpm / tpm windows are whole minutes: start well inside one
            time.sleep(60 - time.time() % 60 + 0.2)
        with httpx.Client(base_url=gurl, timeout=30, trust_env=False) as c:
            post("tenant: pool across policies", "cheap/small key sends model small", "/v1/chat/completions",
                 {"model": "small", "messages": msgs}, "cheap-small",
                 lambda r: None if r.headers.get("x-switchyard-policy") == "cheap" else
                 f"served by policy {r.headers.get('x-switchyard-policy')!r}")
            for model in ("premium-small", "premium-large", "large", "premium"):
                post("tenant: pool across policies", f"cheap/small key sends model {model}", "/v1/chat/completions",
                     {"model": model, "messages": msgs}, "cheap-small",
                     lambda r: None if r.status_code == 403 else f"{r.status_code}: another policy's pool served it")
            t0 = time.perf_counter()
            listed = c.get("/v1/models", headers=h("cheap-small"))
            t.add("tenant: what a key sees", "/v1/models", listed.status_code, (time.perf_counter() - t0) * 1000)
            foreign = [m["id"] for m in listed.json().get("data", []) if m.get("switchyard", {}).get("policy") != "cheap"]
            if foreign:
                wrong.append({"kind": "tenant: what a key sees", "input": "/v1/models", "status": listed.status_code,
                              "wrong": f"lists what the key may not use: {foreign}"})
            post("tenant: what a key sees", "/v1/route", "/v1/route", {"model": "small", "messages": msgs},
                 "cheap-small", lambda r: "replica URLs, health and in-flight shown to a key"
                 if "replicas" in r.text else None)
            codes = [post("tenant: rpm", f"/v1/route #{i + 1} of 5 (rpm 3)", "/v1/route",
                          {"model": "cheap", "messages": msgs}, "rpm3", lambda r: None).status_code for i in range(5)]
            if 429 not in codes:
                wrong.append({"kind": "tenant: rpm", "input": "5 x /v1/route (rpm 3)", "status": codes,
                              "wrong": "/v1/route is not counted against the key's rpm"})

            async def streams() -> list[tuple[int, float]]:
                body = {"model": "cheap", "messages": [{"role": "user", "content": "p" * 1000}], "stream": True,
                        "max_tokens": 100}

                async def one(ac: httpx.AsyncClient) -> tuple[int, float]:
                    t0 = time.perf_counter()
                    async with ac.stream("POST", "/v1/chat/completions", json=body, headers=h("tpm1000")) as r:
                        async for _ in r.aiter_bytes():
                            pass
                        return r.status_code, (time.perf_counter() - t0) * 1000

                async with httpx.AsyncClient(base_url=gurl, timeout=60, trust_env=False) as ac:
                    return await asyncio.gather(*(one(ac) for _ in range(20)))

            admin_h = {"Authorization": f"Bearer {admin}"}
            before = _tokens_of(c.get("/metrics", headers=admin_h).text, "tpm1000")
            timed = asyncio.run(streams())
            for code, ms in timed:  # each stream's own time (20 at once on a shared machine)
                t.add("tenant: tpm", "20 concurrent streams, tpm 1000", code, ms)
            codes = [code for code, _ in timed]
            spent = _tokens_of(c.get("/metrics", headers=admin_h).text, "tpm1000") - before
            figures["tpm_1000_20_streams"] = {"served": codes.count(200), "refused_429": codes.count(429),
                                              "tokens_charged": spent}
            if spent > 2000:
                wrong.append({"kind": "tenant: tpm", "input": "20 concurrent streams, tpm 1000", "status": codes.count(200),
                              "wrong": f"{spent:.0f} tokens charged against tpm 1000"})
            raw = orjson.dumps({"model": "cheap", "messages": [{"role": "user", "content": "z" * 8000}]})
            before = _tokens_of(c.get("/metrics", headers=admin_h).text, "open")
            t0 = time.perf_counter()
            r = c.post("/v1/chat/completions", content=iter([raw[:4000], raw[4000:]]),
                       headers={**h("open"), "Content-Type": "application/json"})
            t.add("tenant: tpm", "chunked body of 2,000 prompt tokens", r.status_code,
                  (time.perf_counter() - t0) * 1000)
            charged = _tokens_of(c.get("/metrics", headers=admin_h).text, "open") - before
            figures["chunked_2000_token_prompt_charged"] = charged
            if charged < 2000:
                wrong.append({"kind": "tenant: tpm", "input": "chunked body of 2,000 prompt tokens",
                              "status": r.status_code, "wrong": f"charged {charged:.0f} tokens"})
    finally:
        gw.stop()
        up.stop()
    return {"wrong_answers": len(wrong), "wrong": wrong, **figures}


# --- the run ----------------------------------------------------------------------------------


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def git_head(tree: Path) -> str:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(tree), "log", "--oneline", "-1"], capture_output=True, text=True,
                              timeout=10).stdout.strip()[:120]
    except (OSError, subprocess.SubprocessError):
        return ""


def mem_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0])
    return out


class LiveProbe(threading.Thread):
    """GET /health/live every 50 ms: the worst answer time says whether the event loop stalled."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.worst_ms = 0.0
        self.worst_at = 0.0  # perf_counter when the worst probe was sent
        self.samples: list[float] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10, trust_env=False) as c:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = c.get(self.url + "/health/live").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.failures += not ok
                ms = (time.perf_counter() - t0) * 1000
                self.samples.append(ms)
                if ms > self.worst_ms:
                    self.worst_ms, self.worst_at = ms, t0
                self.stop.wait(0.05)


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, mem_kb(self.pid)["VmRSS"])
            except (OSError, KeyError):
                return
            self.stop.wait(0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the number of generated inputs")
    ap.add_argument("--slow", type=int, default=4, help="slow clients of each kind (half as many stop reading)")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hardening.json")
    ap.add_argument("--tree", type=Path, default=ROOT,
                    help="run the gateway of this source tree (e.g. a worktree of an older commit)")
    ap.add_argument("--label", default="", help="what the tree is, for the result file")
    args = ap.parse_args()

    import tempfile

    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="sy-hardening-"))
    up, upstream = start_upstream(tmp, "u")
    bad, bad_url = start_bad_upstream(tmp)
    bad_host = bad_url.removeprefix("http://")
    # Pool `bad`: the misbehaving upstream, its key set through a merge key; pool `creds`: the same
    # upstream behind a URL with credentials (a key and URL credentials together were a 500 before
    # issue 28, which would hide every other probe). Circuits never open: every probe reaches it.
    policy = (f"version: 1\nname: p\npools:\n  small:\n    model: m\n    replicas: [{{url: '{upstream}/v1'}}]\n"
              f"  bad:\n    <<: {{api_key: {POOL_KEY}}}\n    model: b\n    retries: 0\n"
              "    circuit: {failures: 1000000, cooldown: 1}\n    health: {interval: 3600}\n"
              f"    replicas: [{{url: '{bad_url}/v1'}}]\n"
              "  creds:\n    model: c\n    retries: 0\n    circuit: {failures: 1000000, cooldown: 1}\n"
              f"    health: {{interval: 3600}}\n    replicas: [{{url: 'http://agent:{URL_SECRET}@{bad_host}/v1'}}]\n"
              "session: {pin: pool}\nroutes:\n  - {name: canary, when: {header.x-canary: '1', text: 'a+b'}, "
              "pool: small}\n  - {name: default, pool: small}\n")
    pol = tmp / "p.yaml"
    pol.write_text(policy)
    tree = args.tree.resolve()
    gw, gurl = start_gateway(tmp, [pol], "--header-timeout", "2", "--body-timeout", "2", "--client-timeout", "2",
                             "--no-watch", cwd=tree)
    gw_module = (tree / "switchyard" / "__init__.py").exists()
    assert gw_module, f"{tree} is not a source tree of switchyard"
    port = int(gurl.rsplit(":", 1)[1])
    pid = gw.p.pid
    t = Tally(pid)
    probe, sampler = LiveProbe(gurl), RssSampler(pid)
    try:
        with httpx.Client(base_url=gurl, timeout=15, trust_env=False) as c:
            for _ in range(50):  # warm-up: the first requests pay for lazy imports and connections
                c.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user", "content": "x"}]})
            mem_start = mem_kb(pid)
            t.hwm = mem_start["VmHWM"]
            probe.start()
            sampler.start()
            t0 = time.monotonic()
            handmade(t, c, port, policy, args.scale)
            work_bombs(t, c, args.scale)
            edge_bombs(t, c)
            misbehaviour = upstream_misbehaviour(t, c, bad_url, policy)
            generated(t, c, args.scale, args.seed)
            slow = slow_clients(t, port, upstream, args.slow)
            lanes = tenant_lanes(t, tmp, tree)
            took = time.monotonic() - t0
            after = c.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user",
                                                                                        "content": "still?"}]})
            metrics = c.get("/metrics").text
        probe.stop.set()
        sampler.stop.set()
        probe.join()
        sampler.join()
        mem_end = mem_kb(pid)
        alive = gw.p.poll() is None
    finally:
        gw.stop()
        up.stop()
        bad.stop()

    outs = t.outcomes
    kinds = Counter(o.kind for o in outs)
    statuses: dict[str, Counter] = defaultdict(Counter)
    for o in outs:
        statuses[o.kind][str(o.status)] += 1
    # An upstream probe's 502/503/504 is the gateway saying the upstream failed (what it should):
    # only a 500 of the gateway's own is a gateway 5xx there.
    fives = [o for o in outs if isinstance(o.status, int) and o.status >= 500
             and not (o.kind.startswith("upstream:") and o.status in (502, 503, 504))]
    hangs = [o for o in outs if o.status in ("hang", "error")]
    fast_refusals = sorted((o for o in outs if refused(o) and o.kind not in SLOW_KINDS), key=lambda o: -o.ms)
    slow_cut = {k: {"n": len(v), "ended_after_s": [round(min(v) / 1000, 2), round(max(v) / 1000, 2)],
                    "ends": dict(Counter(str(o.status) for o in outs if o.kind == k))}
                for k in SLOW_KINDS if (v := [o.ms for o in outs if o.kind == k])}
    stalls = next((float(ln.split()[-1]) for ln in metrics.splitlines()
                   if ln.startswith("switchyard_client_stalls_total")), None)
    refusal_ms = [o.ms for o in fast_refusals]
    # The input in flight when /health/live answered slowest (the loop was stalled by it, or by
    # what the machine's other work took from the gateway's core).
    stalled_by = next((f"[{o.kind}] {o.label[:120]}" for o in outs
                       if o.t_end - o.ms / 1000 - 0.05 <= probe.worst_at <= o.t_end), "no input in flight")
    result = {
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_1m_at_start": round(os.getloadavg()[0], 2),
                    "python": platform.python_version(),
                    "note": "shared with other work (other sessions' tests and benches ran at the same time)"},
        "tree": {"path": str(tree), "label": args.label or git_head(tree)},
        "settings": {"scale": args.scale, "seed": args.seed, "slow_per_kind": args.slow,
                     "gateway": "open mode, --header-timeout 2 --body-timeout 2 --client-timeout 2"},
        "inputs_tried": len(outs),
        "by_kind": dict(kinds),
        "statuses_by_kind": {k: dict(v) for k, v in statuses.items()},
        "refusals": len(fast_refusals),
        "refusal_ms": {"p50": round(statistics.median(refusal_ms), 2) if refusal_ms else None,
                       "p99": round(sorted(refusal_ms)[int(0.99 * (len(refusal_ms) - 1))], 2) if refusal_ms else None},
        "slowest_refusals": [{"ms": round(o.ms, 1), "kind": o.kind, "input": o.label[:200], "status": o.status}
                             for o in fast_refusals[:5]],
        "slow_clients": {**slow_cut, **slow, "gateway_client_stalls_total": stalls,
                         "note": "timeouts 2 s; 'stopped reading' clients read nothing for 6 s, then drain: "
                                 "'cut' = the stream ended without its [DONE]"},
        "biggest_peak_raises": [{"kb": o.peak_raise_kb, "kind": o.kind, "input": o.label[:200]}
                                for o in sorted(outs, key=lambda o: -o.peak_raise_kb)[:5]],
        "upstream_probes": {"tried": misbehaviour["tried"], "wrong_answers": len(misbehaviour["wrong"]),
                            "wrong": misbehaviour["wrong"]},
        "tenant_lanes": lanes,
        "gateway_5xx": [{"kind": o.kind, "input": o.label[:300], "status": o.status} for o in fives],
        "hangs_or_errors": [{"kind": o.kind, "input": o.label[:300], "status": o.status} for o in hangs],
        "rss_kb": {"after_warmup": mem_start["VmRSS"], "vmhwm_after_warmup": mem_start["VmHWM"],
                   "peak_sampled": sampler.peak, "peak_vmhwm": mem_end["VmHWM"],
                   "end": mem_end["VmRSS"]},
        "health_live_worst_ms": round(probe.worst_ms, 1),
        "health_live_worst_during": stalled_by,
        "health_live_ms": {"n": len(probe.samples), "p50": round(statistics.median(probe.samples), 1),
                           "p99": round(sorted(probe.samples)[int(0.99 * (len(probe.samples) - 1))], 1),
                           "over_100": sum(1 for x in probe.samples if x > 100)} if probe.samples else None,
        "health_live_failures": probe.failures,
        "gateway_alive_after": alive and after.status_code == 200,
        "seconds": {"inputs": round(took, 1), "total": round(time.monotonic() - t_start, 1)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"bad inputs tried: {len(outs)} in {took:.0f} s")
    for k, n in kinds.most_common():
        print(f"  {n:5d}  {k:24s} {dict(statuses[k])}")
    print(f"refusals (4xx or cut, slow clients aside): {len(fast_refusals)}, p50 {result['refusal_ms']['p50']} ms, "
          f"p99 {result['refusal_ms']['p99']} ms")
    for o in fast_refusals[:3]:
        print(f"  slowest: {o.ms:7.1f} ms  {o.status}  [{o.kind}] {o.label[:100]}")
    for k, v in slow_cut.items():
        print(f"  {k}: {v['n']}, ended after {v['ended_after_s'][0]}-{v['ended_after_s'][1]} s: {v['ends']}")
    print(f"  upstream requests cancelled by stalled clients: {slow['upstream_cancelled']}, "
          f"client_stalls_total {stalls}")
    print(f"gateway RSS: {mem_start['VmRSS'] / 1024:.0f} MB after warm-up (VmHWM {mem_start['VmHWM'] / 1024:.0f} MB), peak {mem_end['VmHWM'] / 1024:.0f} MB "
          f"(VmHWM; sampled {sampler.peak / 1024:.0f} MB), {mem_end['VmRSS'] / 1024:.0f} MB at the end")
    for o in sorted(outs, key=lambda o: -o.peak_raise_kb)[:3]:
        print(f"  peak raised {o.peak_raise_kb / 1024:5.1f} MB by [{o.kind}] {o.label[:100]}")
    print(f"upstream probes: {misbehaviour['tried']} tried, {len(misbehaviour['wrong'])} answered wrongly")
    for w in misbehaviour["wrong"]:
        print(f"  wrong: [{w['kind']}] {w['input']}: {w['wrong']} (status {w['status']})")
    print(f"tenant lanes (a keyed gateway): {lanes['wrong_answers']} answered wrongly; "
          f"tpm 1000, 20 streams: {lanes.get('tpm_1000_20_streams')}; chunked 2,000-token prompt charged "
          f"{lanes.get('chunked_2000_token_prompt_charged')}")
    for w in lanes["wrong"]:
        print(f"  wrong: [{w['kind']}] {w['input']}: {w['wrong']} (status {w['status']})")
    print(f"/health/live worst {probe.worst_ms:.0f} ms ({stalled_by}), {probe.failures} failures; "
          f"{result['health_live_ms']}")
    print(f"5xx from the gateway: {len(fives)}; hangs or client errors: {len(hangs)}; alive after: "
          f"{result['gateway_alive_after']}")
    for o in (fives + hangs)[:10]:
        print(f"  {o.status} [{o.kind}] {o.label[:200]}")
    print(f"wrote {args.out}")
    sys.exit(1 if fives or hangs or not result["gateway_alive_after"] else 0)


if __name__ == "__main__":
    main()
