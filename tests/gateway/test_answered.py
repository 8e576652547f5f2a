"""A non-streaming answer's accounting (Answered's `after`) runs once its body is handed to the
server, and however the sending ends; under our server the answer leaves in one write of the
connection's (api/server.py's `answer`) and keeps HTTP/1.1's rules: keep-alive, pipelining,
`Connection: close`, 100 Continue, the safe headers and the access log. A body that arrived with
its headers is taken whole (api/guard.py's `whole`) and still counted against the limit."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
from procs import start_gateway, start_upstream

from switchyard.api.replies import Answered

LIMIT = 2048  # the gateway's --max-body-mb, in bytes
BODY = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hello"}]}).encode()


async def _noop_receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def test_after_runs_once_the_body_is_handed_over() -> None:
    seen: list[str] = []

    async def send(msg: dict[str, Any]) -> None:
        seen.append(msg["type"])

    resp = Answered(b'{"ok": true}', 200, {"x-switchyard-pool": "small"}, "application/json",
                    after=lambda: seen.append("after"))
    await resp({"type": "http"}, _noop_receive, send)
    assert seen == ["http.response.start", "http.response.body", "after"]
    assert (b"content-length", b"12") in resp.raw_headers


async def test_after_runs_when_the_client_is_gone_mid_answer() -> None:
    seen: list[str] = []

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.body":
            raise ConnectionResetError("the client left")
        seen.append(msg["type"])

    resp = Answered(b"{}", 200, {}, "application/json", after=lambda: seen.append("after"))
    with pytest.raises(ConnectionResetError):
        await resp({"type": "http"}, _noop_receive, send)
    assert seen == ["http.response.start", "after"]


# --- through a real gateway and upstream ------------------------------------------------------


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("answered")
    up, url = start_upstream(tmp, "u")
    pol = tmp / "p.yaml"
    pol.write_text(f"version: 1\nname: p\npools:\n  small:\n    model: m\n    replicas:\n      - url: {url}/v1\n"
                   "routes:\n  - {name: default, pool: small}\n")
    proc, gurl = start_gateway(tmp, [pol], "--access-log", "--max-body-mb", str(LIMIT / 1024 / 1024))
    yield proc, int(gurl.rsplit(":", 1)[1])
    proc.stop()
    up.stop()


def _body(text: str) -> bytes:
    return json.dumps({"model": "auto", "messages": [{"role": "user", "content": text}]}).encode()


def _request(extra: str = "", body: bytes = BODY) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def _read_answer(s: socket.socket, buf: bytearray) -> tuple[bytes, dict[str, str], bytes]:
    """One answer off the socket (status line, headers, a body of Content-Length bytes)."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"closed mid-head: {bytes(buf)!r}"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.decode().lower(): v.decode() for k, v in (line.split(b": ", 1) for line in lines)}
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = s.recv(65536)
        assert chunk, "closed mid-body"
        rest += chunk
    buf[:] = rest[n:]
    return status, headers, rest[:n]


def _ok(status: bytes, headers: dict[str, str], body: bytes) -> None:
    assert status == b"HTTP/1.1 200 OK", status
    assert headers["x-content-type-options"] == "nosniff" and "date" in headers
    assert headers["x-switchyard-pool"] == "small" and headers["content-type"].startswith("application/json")
    assert json.loads(body)["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.slow  # the one write of our server's connection: only a real gateway process has it
def test_answers_keep_alive_and_pipelined_requests_answer_in_order(gw):
    proc, port = gw
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        buf = bytearray()
        for _ in range(3):  # one after another on one connection
            s.sendall(_request())
            _ok(*_read_answer(s, buf))
        # Two requests in one write: the second waits for the first's answer (uvicorn's queue),
        # and each answer is whole and in order.
        s.sendall(_request(body=_body("first")) + _request(body=_body("second")))
        answers = [_read_answer(s, buf), _read_answer(s, buf)]
        for a in answers:
            _ok(*a)
        assert [json.loads(a[2])["choices"][0]["message"]["content"] for a in answers] == [
            "u echoes: first", "u echoes: second"]
        assert not buf
    time.sleep(0.2)
    assert proc.output().count('"POST /v1/chat/completions HTTP/1.1" 200') >= 5  # the access log still sees them


@pytest.mark.slow  # the one write of our server's connection: only a real gateway process has it
def test_connection_close_ends_the_connection_after_the_answer(gw):
    _, port = gw
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_request("Connection: close\r\n"))
        buf = bytearray()
        status, headers, body = _read_answer(s, buf)
        _ok(status, headers, body)
        assert headers["connection"] == "close"
        assert s.recv(1024) == b"" and not buf  # closed, nothing after the answer


@pytest.mark.slow  # the one write of our server's connection: only a real gateway process has it
def test_expect_100_continue_gets_its_interim_answer_first(gw):
    _, port = gw
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_request("Expect: 100-continue\r\n")[:-len(BODY)])  # the head alone
        got = s.recv(1024)
        assert got == b"HTTP/1.1 100 Continue\r\n\r\n", got
        s.sendall(BODY)
        _ok(*_read_answer(s, bytearray()))


def _chunked(body: bytes) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))


@pytest.mark.slow  # the one write of our server's connection: only a real gateway process has it
def test_a_body_that_came_whole_is_still_held_to_the_limit(gw):
    """Without a Content-Length the edge guard cannot refuse up front: a chunked body that arrived
    in one piece is taken whole and counted, as one read piece by piece would be."""
    _, port = gw
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        buf = bytearray()
        s.sendall(_chunked(_body("small and chunked")))
        status, headers, body = _read_answer(s, buf)
        _ok(status, headers, body)
        assert json.loads(body)["choices"][0]["message"]["content"] == "u echoes: small and chunked"
        s.sendall(_chunked(_body("x" * LIMIT)))
        status, headers, body = _read_answer(s, buf)
        assert status.startswith(b"HTTP/1.1 413") and json.loads(body)["error"]["code"] == "request_too_large"


@pytest.mark.slow  # the request's task start (api/server.py): only a real gateway process has it
def test_a_body_after_its_headers_or_in_pieces_is_read_whole(gw):
    """The request's task starts once its body is in (at once, eagerly, on Python 3.12+) or, when
    the body comes in later reads, at the end of the read that brought the headers: both answer."""
    _, port = gw
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        body = _body("in pieces")
        req = _request(body=body)
        head = req[:-len(body)]
        s.sendall(head)  # the headers alone, then the body in three reads
        for i in range(0, len(body), len(body) // 3 + 1):
            time.sleep(0.05)
            s.sendall(body[i:i + len(body) // 3 + 1])
        status, headers, got = _read_answer(s, buf)
        _ok(status, headers, got)
        assert json.loads(got)["choices"][0]["message"]["content"] == "u echoes: in pieces"
        s.sendall(_request(body=_body("whole")))  # and the next one whole, on the same connection
        status, headers, got = _read_answer(s, buf)
        _ok(status, headers, got)
        assert json.loads(got)["choices"][0]["message"]["content"] == "u echoes: whole"
