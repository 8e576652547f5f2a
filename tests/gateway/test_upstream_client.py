"""The request path's upstream client (switchyard/pools/upstream.py) against raw asyncio servers in
process: what it must keep of aiohttp's behaviour on this path (the dispatcher reads both alike)."""

from __future__ import annotations

import asyncio
import gzip

import aiohttp
import pytest

from switchyard.pools.upstream import UpstreamPool

OK = b'{"ok": true}'


async def serve(answer, seen: list | None = None):  # noqa: ANN001
    """A server that calls answer(transport, request_bytes) once a request's head and body are in."""

    class P(asyncio.Protocol):
        def connection_made(self, t):  # noqa: ANN001
            self.t, self.buf = t, b""
            if seen is not None:
                seen.append(self)
            self.lost = asyncio.get_running_loop().create_future()

        def connection_lost(self, exc):  # noqa: ANN001
            if not self.lost.done():
                self.lost.set_result(True)

        def data_received(self, d: bytes) -> None:
            self.buf += d
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if not sep:
                return
            n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) >= n:
                self.buf = rest[n:]
                answer(self.t, head + sep + rest[:n])

    srv = await asyncio.get_running_loop().create_server(P, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1"


def fixed(raw: bytes):  # noqa: ANN201
    return lambda t, req: t.write(raw)


async def post(pool: UpstreamPool, total: float = 5.0, **kw):  # noqa: ANN003, ANN201
    return await pool.post("/chat/completions", b"{}", {"Content-Type": "application/json", **kw}, total, 2.0, None)


async def test_keep_alive_gzip_chunked_and_the_request_sent():
    body = gzip.compress(OK)
    got: list[bytes] = []

    def answer(t, req):  # noqa: ANN001
        got.append(req)
        t.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
                b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))

    seen: list = []
    srv, url = await serve(answer, seen)
    pool = UpstreamPool(url)
    for _ in range(3):
        r = await post(pool)
        assert r.status == 200 and r.headers.get("Content-Encoding") == "gzip"
        assert await r.content.read() == OK and await r.content.read() == b""
        r.release()
    assert len(seen) == 1, "one connection, kept alive"
    assert got[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Content-Length: 2\r\n" in got[0] and got[0].endswith(b"\r\n\r\n{}")
    pool.close()
    srv.close()


async def test_redirects_are_answers_and_close_delimited_bodies_end():
    srv, url = await serve(fixed(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: http://elsewhere/\r\ncontent-length: 0\r\n\r\n"))
    r = await post(UpstreamPool(url))
    assert r.status == 307 and r.headers["location"] == "http://elsewhere/"
    r.close()
    srv.close()

    def close_delimited(t, req):  # noqa: ANN001
        t.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + OK)
        t.close()

    srv, url = await serve(close_delimited)
    r = await post(UpstreamPool(url))
    assert await r.content.read() == OK and await r.content.read() == b""
    srv.close()


async def test_a_cut_body_raises_a_payload_error():
    def cut(t, req):  # noqa: ANN001
        t.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                b"6\r\ndata: \r\n")
        t.close()

    srv, url = await serve(cut)
    r = await post(UpstreamPool(url))
    assert await r.content.readany() == b"data: "
    with pytest.raises(aiohttp.ClientPayloadError):
        await r.content.readany()
    srv.close()


async def test_timeouts_and_refusals_in_aiohttps_terms():
    seen: list = []
    srv, url = await serve(lambda t, req: None, seen)  # never answers
    with pytest.raises(TimeoutError) as e:
        await post(UpstreamPool(url), total=0.2)
    assert not isinstance(e.value, aiohttp.ConnectionTimeoutError)  # the upstream took it: not retried
    await asyncio.wait_for(seen[0].lost, 2)  # and its connection was closed
    srv.close()
    port = url.split(":")[2].split("/")[0]
    await srv.wait_closed()
    with pytest.raises(aiohttp.ClientConnectionError):
        await post(UpstreamPool(f"http://127.0.0.1:{port}/v1"))


async def test_a_cancelled_request_closes_its_connection():
    seen: list = []
    srv, url = await serve(lambda t, req: None, seen)
    task = asyncio.ensure_future(post(UpstreamPool(url)))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.wait_for(seen[0].lost, 2), "the upstream sees the request go"
    srv.close()


async def test_a_server_that_closes_before_answering():
    srv, url = await serve(lambda t, req: t.close())
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await post(UpstreamPool(url))
    srv.close()
