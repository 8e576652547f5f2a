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

from procs import start_gateway, start_upstream  # noqa: E402 - the tests' process helpers


def _load_fuzz() -> Any:
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


@dataclass
class Tally:
    pid: int
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hwm: int = 0

    def add(self, kind: str, label: str, status: int | str, ms: float) -> None:
        with self.lock:
            hwm = mem_kb(self.pid).get("VmHWM", self.hwm)
            self.outcomes.append(Outcome(kind, label, status, ms, max(0, hwm - self.hwm)))
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


# --- the run ----------------------------------------------------------------------------------


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
                self.worst_ms = max(self.worst_ms, (time.perf_counter() - t0) * 1000)
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
    args = ap.parse_args()

    import tempfile

    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="sy-hardening-"))
    up, upstream = start_upstream(tmp, "u")
    policy = (f"version: 1\nname: p\npools:\n  small:\n    model: m\n    replicas: [{{url: '{upstream}/v1'}}]\n"
              "session: {pin: pool}\nroutes:\n  - {name: canary, when: {header.x-canary: '1', text: 'a+b'}, "
              "pool: small}\n  - {name: default, pool: small}\n")
    pol = tmp / "p.yaml"
    pol.write_text(policy)
    gw, gurl = start_gateway(tmp, [pol], "--header-timeout", "2", "--body-timeout", "2", "--client-timeout", "2",
                             "--no-watch")
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
            generated(t, c, args.scale, args.seed)
            slow = slow_clients(t, port, upstream, args.slow)
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

    outs = t.outcomes
    kinds = Counter(o.kind for o in outs)
    statuses: dict[str, Counter] = defaultdict(Counter)
    for o in outs:
        statuses[o.kind][str(o.status)] += 1
    fives = [o for o in outs if isinstance(o.status, int) and o.status >= 500]
    hangs = [o for o in outs if o.status in ("hang", "error")]
    fast_refusals = sorted((o for o in outs if refused(o) and o.kind not in SLOW_KINDS), key=lambda o: -o.ms)
    slow_cut = {k: {"n": len(v), "ended_after_s": [round(min(v) / 1000, 2), round(max(v) / 1000, 2)],
                    "ends": dict(Counter(str(o.status) for o in outs if o.kind == k))}
                for k in SLOW_KINDS if (v := [o.ms for o in outs if o.kind == k])}
    stalls = next((float(ln.split()[-1]) for ln in metrics.splitlines()
                   if ln.startswith("switchyard_client_stalls_total")), None)
    refusal_ms = [o.ms for o in fast_refusals]
    result = {
        "machine": {"cpus": os.cpu_count(), "load_1m_at_start": round(os.getloadavg()[0], 2),
                    "python": platform.python_version()},
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
        "gateway_5xx": [{"kind": o.kind, "input": o.label[:300], "status": o.status} for o in fives],
        "hangs_or_errors": [{"kind": o.kind, "input": o.label[:300], "status": o.status} for o in hangs],
        "rss_kb": {"after_warmup": mem_start["VmRSS"], "vmhwm_after_warmup": mem_start["VmHWM"],
                   "peak_sampled": sampler.peak, "peak_vmhwm": mem_end["VmHWM"],
                   "end": mem_end["VmRSS"]},
        "health_live_worst_ms": round(probe.worst_ms, 1),
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
    print(f"/health/live worst {probe.worst_ms:.0f} ms, {probe.failures} failures")
    print(f"5xx from the gateway: {len(fives)}; hangs or client errors: {len(hangs)}; alive after: "
          f"{result['gateway_alive_after']}")
    for o in (fives + hangs)[:10]:
        print(f"  {o.status} [{o.kind}] {o.label[:200]}")
    print(f"wrote {args.out}")
    sys.exit(1 if fives or hangs or not result["gateway_alive_after"] else 0)


if __name__ == "__main__":
    main()
