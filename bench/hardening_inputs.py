"""bench/hardening.py's inputs from the client's side: hand-made ones (deep JSON, huge and malformed
headers, huge bodies, alias-bomb and backtracking-regex policies through the UI), the generated
ones (tests/gateway/test_fuzz.py's strategies), slow clients all at once, and issue 28's work bombs
and edge limits."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
from hardening_kit import ROOT, Tally, json_post, send_http, send_raw


def _load_fuzz() -> Any:
    # test_fuzz.py imports its neighbours (inproc, gwkit) as the gateway tests' conftest allows.
    if str(ROOT / "tests" / "gateway") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests" / "gateway"))
    spec = importlib.util.spec_from_file_location("hardening_fuzz", ROOT / "tests" / "gateway" / "test_fuzz.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


