"""The request path's upstream client: HTTP/1.1 POSTs on asyncio protocols, parsed by httptools
(llhttp, the parser uvicorn serves the gateway with), kept alive per replica.

Why not aiohttp here (it stays for health checks, discovery, /tokenize, load polling): measured
on one core (bench/server_cores.py, 2-core AMD EPYC), a bare forwarder cost 223-272 us of CPU a
request with aiohttp and 99 us with this protocol, and issue #31's goal leaves ~260 us for the
whole gateway. pyreqwest (140-151 us) was measured too and left out: a cancelled request is not
aborted upstream (the upstream kept it 3 s, so a client that leaves would hold a replica slot),
and a total timeout is reported as a connect timeout (it would be retried as one).

What it keeps of aiohttp's behaviour on this path, so the dispatcher, the usage tap and the relay
are unchanged: the same surface (`status`, `headers.get`, `content_length`, `content.read(n)` /
`readany()`, `release()`, `close()`) and the same exceptions (aiohttp's classes: a connect
timeout is `ConnectionTimeoutError`, the total timeout `TimeoutError`, a cut body
`ClientPayloadError`, a connection that closes before an answer `ServerDisconnectedError`);
redirects are never followed (a 3xx is an answer); gzip and deflate are decoded; a total timeout
(one deadline a request, from connect to the body's end, on pools/deadlines.py) and a connect timeout; a cancelled request
aborts its connection; reading pauses past HIGH_WATER bytes unread. No cookies are kept, no proxy
from the environment is used (as the aiohttp session was set up).
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httptools

from switchyard.pools.deadlines import Deadlines

KEEPALIVE = 60.0  # seconds an idle connection is kept (the aiohttp connector's keepalive_timeout)
HIGH_WATER = 256 * 1024  # unread bytes at which reading the upstream pauses (a slow client)
_SSL: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    global _SSL
    if _SSL is None:
        _SSL = ssl.create_default_context()
    return _SSL


class Headers(dict):
    """Response headers: lowercase names, the first value of each; `get` in any case."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return dict.__getitem__(self, key.lower())

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key.lower() if isinstance(key, str) else key)


class Content:
    """The body as it arrives (aiohttp's StreamReader, the two reads the gateway uses)."""

    __slots__ = ("_chunks", "_size", "_eof", "_exc", "_waiter", "_conn")

    def __init__(self, conn: Connection) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._conn = conn

    def _feed(self, b: bytes) -> None:
        if b:
            self._chunks.append(b)
            self._size += len(b)
            if self._size > HIGH_WATER:
                self._conn.pause()
            self._wake()

    def _end(self, exc: BaseException | None = None) -> None:
        if not self._eof:
            self._eof = True
            self._exc = exc
            self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    async def _wait(self) -> None:
        while not self._chunks and not self._eof:
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _take(self, n: int) -> bytes:
        chunks = self._chunks
        if len(chunks) == 1 and len(chunks[0]) <= n:
            out = chunks.popleft()
        else:
            parts, got = [], 0
            while chunks and got < n:
                c = chunks.popleft()
                if got + len(c) > n:
                    chunks.appendleft(c[n - got:])
                    c = c[:n - got]
                parts.append(c)
                got += len(c)
            out = b"".join(parts)
        self._size -= len(out)
        if self._size <= HIGH_WATER // 4:
            self._conn.resume()
        return out

    def ready(self) -> bytes | None:
        """All of the body, without an await, once all of it has arrived cleanly; else None."""
        if not self._eof or self._exc is not None:
            return None
        return self._take(self._size) if self._chunks else b""

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (all that is buffered, for n < 0), once some are there; b"" at the end."""
        if not self._chunks and not self._eof:
            await self._wait()
        if self._chunks:
            return self._take(self._size if n < 0 else n)
        if self._exc is not None:
            raise self._exc
        return b""

    async def readany(self) -> bytes:
        return await self.read(-1)


class Response:
    """One upstream answer (what the dispatcher reads of aiohttp's ClientResponse)."""

    __slots__ = ("status", "headers", "content", "_conn", "_done")

    def __init__(self, conn: Connection, status: int, headers: Headers) -> None:
        self.status = status
        self.headers = headers
        self.content = conn.content
        self._conn = conn
        self._done = False

    @property
    def content_length(self) -> int | None:
        v = self.headers.get("content-length")
        try:
            return int(v) if v is not None else None
        except ValueError:
            return None

    def release(self) -> None:
        """Done with it: the connection goes back to its pool if the answer ended cleanly."""
        if not self._done:
            self._done = True
            self._conn.finished()

    def close(self) -> None:
        """Done with it before its end: the connection closes (the upstream sees the client go)."""
        if not self._done:
            self._done = True
            self._conn.abort()


class Connection(asyncio.Protocol):
    """One keep-alive connection to a replica; one request at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.content: Content = Content(self)
        self._head: asyncio.Future[Response] | None = None
        self._headers: Headers = Headers()
        self._complete = False
        self._keep = False  # the answer ended and both sides keep the connection alive
        self._paused = False
        self._decoder: Any = None
        self._delimited = True  # the body has a length or is chunked (else it ends with the connection)

    # --- the protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(aiohttp.ClientConnectionError("the upstream asked for a protocol upgrade"))
        except httptools.HttpParserError as e:
            self._fail(aiohttp.ClientPayloadError(f"invalid HTTP from the upstream: {e}")
                       if self._head is None or self._head.done()
                       else aiohttp.ClientConnectionError(f"invalid HTTP from the upstream: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        head = self._head
        if head is not None and not head.done():
            head.set_exception(aiohttp.ServerDisconnectedError() if exc is None
                               else aiohttp.ClientOSError(getattr(exc, "errno", 0) or 0, str(exc)))
        elif not self._complete:
            if not self._delimited and exc is None:  # an answer that ends with its connection
                self._finish_body()
            else:
                self.content._end(aiohttp.ClientPayloadError("Response payload is not completed"))

    def pause_writing(self) -> None:  # a request body is one write: nothing to hold back
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        # The first value of a repeated header wins; dict's own setdefault (Headers lowercases
        # in Python, and names here are lowercased already).
        self._headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        h = self._headers
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            self._headers = Headers()
            return
        self._delimited = "content-length" in h or "chunked" in h.get("transfer-encoding", "").lower()
        enc = h.get("content-encoding", "").strip().lower()
        if enc in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif enc == "deflate":
            self._decoder = "deflate"  # zlib-wrapped or raw: the first bytes say
        head = self._head
        if head is not None and not head.done():
            head.set_result(Response(self, status, h))

    def on_body(self, body: bytes) -> None:
        d = self._decoder
        if d is not None:
            try:
                if d == "deflate":
                    d = self._decoder = zlib.decompressobj(zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS)
                body = d.decompress(body)
            except zlib.error as e:
                self._fail(aiohttp.ClientPayloadError(f"cannot decode the upstream's body: {e}"))
                return
        self.content._feed(body)

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() < 200:
            return
        self._keep = self.parser.should_keep_alive()  # read here: llhttp forgets it once the message is done
        self._finish_body()

    def _finish_body(self) -> None:
        d = self._decoder
        if d is not None and d != "deflate":
            try:
                self.content._feed(d.flush())
            except zlib.error:
                pass
        self._complete = True
        self._cancel_timer()
        self.content._end()

    # --- a request ---------------------------------------------------------------------------

    def send(self, data: bytes, deadline: float | None) -> asyncio.Future[Response]:
        self.content = Content(self)
        self._headers = Headers()
        self._complete = False
        self._keep = False
        self._decoder = None
        self._delimited = True
        self._head = head = self.loop.create_future()
        if deadline is not None:
            self.pool.deadlines.set(self, deadline, self._timed_out)
        assert self.transport is not None
        self.transport.write(data)
        return head

    def _timed_out(self) -> None:
        self._fail(TimeoutError())

    def _cancel_timer(self) -> None:
        self.pool.deadlines.clear(self)

    def _fail(self, exc: BaseException) -> None:
        head = self._head
        if head is not None and not head.done():
            head.set_exception(exc)
        else:
            self.content._end(exc)
        self.abort()

    def pause(self) -> None:
        if not self._paused and self.transport is not None and not self.closed:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def finished(self) -> None:
        """The caller is done with the answer: keep the connection for the next request if the
        answer ended and both sides keep it alive; else close it."""
        self._cancel_timer()
        if self._complete and self._keep and not self.closed and not self.content._chunks:
            self.resume()
            self._head = None
            self.idle_since = time.monotonic()
            self.pool.idle.append(self)
        else:
            self.abort()

    def abort(self) -> None:
        self._cancel_timer()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()


class UpstreamPool:
    """Keep-alive connections to one replica's origin (scheme, host, port)."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.https = u.scheme == "https"
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.https else 80)
        default = (self.port == 443) if self.https else (self.port == 80)
        name = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = (name if default else f"{name}:{self.port}").encode("idna")
        self.base_path = u.path.rstrip("/")
        self.idle: list[Connection] = []
        self.loop = asyncio.get_event_loop()
        self.deadlines = Deadlines(self.loop)  # each request's total time (a dict entry, not a timer)
        self.closed = False
        # The last request head: (path, auth, headers, bytes up to the Content-Length value).
        self._head: tuple[str, aiohttp.BasicAuth | None, dict[str, str], bytes] | None = None

    def _request_head(self, path: str, headers: dict[str, str], auth: aiohttp.BasicAuth | None) -> bytes:
        """The request line and headers, up to the Content-Length header's value."""
        lines = [b"POST ", (self.base_path + path).encode(), b" HTTP/1.1\r\nHost: ", self.host_header, b"\r\n"]
        for k, v in headers.items():
            if "\r" in v or "\n" in v or "\r" in k or "\n" in k:
                raise ValueError(f"header {k!r} holds a line break")
            lines += (k.encode("latin-1"), b": ", v.encode("latin-1"), b"\r\n")
        if auth is not None and "Authorization" not in headers:
            lines += (b"Authorization: ", auth.encode().encode("latin-1"), b"\r\n")
        if "Accept" not in headers:
            lines.append(b"Accept: */*\r\n")
        lines.append(b"Content-Length: ")
        return b"".join(lines)

    def _idle_conn(self) -> Connection | None:
        idle = self.idle
        now = time.monotonic()
        while idle:
            c = idle.pop()
            if not c.closed and now - c.idle_since < KEEPALIVE and not c.transport.is_closing():  # type: ignore[union-attr]
                return c
            c.abort()
        return None

    async def _connect(self, timeout: float | None) -> Connection:
        coro = self.loop.create_connection(lambda: Connection(self), self.host, self.port,
                                           ssl=_ssl_context() if self.https else None)
        try:
            if timeout is None:
                _, conn = await coro
            else:
                async with asyncio.timeout(timeout):
                    _, conn = await coro
        except TimeoutError:
            raise aiohttp.ConnectionTimeoutError(
                f"Connection timeout to host {self.host}:{self.port}") from None
        except ssl.SSLError as e:
            raise aiohttp.ClientConnectionError(f"TLS with {self.host}:{self.port} failed: {e}") from None
        except OSError as e:
            raise aiohttp.ClientOSError(e.errno or 0, f"Cannot connect to host {self.host}:{self.port}: "
                                                      f"{e.strerror or e}") from None
        return conn

    async def post(self, path: str, payload: bytes, headers: dict[str, str], total: float | None,
                   connect: float | None, auth: aiohttp.BasicAuth | None) -> Response:
        """POST `payload` to `path` (under the replica's URL) and wait for the answer's head. The
        total timeout runs from here to the end of the body; a connect timeout is its own error."""
        if self.closed:
            raise aiohttp.ClientConnectionError("the replica's connection pool is closed")
        loop = asyncio.get_running_loop()
        if loop is not self.loop:  # a new event loop (tests run several): the old connections are its
            self.idle.clear()
            self.loop = loop
            self.deadlines = Deadlines(loop)
        deadline = None if not total else loop.time() + total
        # A pool's requests share one head but for the length: built once, kept while the path,
        # the headers (compared by value: a traced attempt's differ each time) and auth stay.
        cached = self._head
        if cached is not None and cached[0] == path and cached[1] is auth and cached[2] == headers:
            head = cached[3]
        else:
            head = self._request_head(path, headers, auth)
            self._head = (path, auth, dict(headers), head)
        data = b"".join((head, str(len(payload)).encode(), b"\r\n\r\n", payload))
        conn = self._idle_conn()
        if conn is None:
            budget = connect if connect else None
            if deadline is not None:
                left = deadline - loop.time()
                budget = left if budget is None else min(budget, left)
            conn = await self._connect(budget)
        head = conn.send(data, deadline)
        try:
            return await head
        except BaseException:
            conn.abort()  # cancelled, timed out or failed before the head: the upstream sees us go
            raise

    def close(self) -> None:
        self.closed = True
        for c in self.idle:
            c.abort()
        self.idle.clear()
