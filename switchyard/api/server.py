"""The gateway's HTTP server: uvicorn (uvloop, httptools) with the limits an internet-facing
proxy needs, and a drain on SIGTERM.

uvicorn bounds idle keep-alive connections and, with `limit_concurrency`, open connections;
it has no bound on how long a client may take to send its headers, how large they may be, or
how long a response may sit unread. GuardedHttpProtocol adds those three at the connection
(nginx's client_header_timeout, large_client_header_buffers and send_timeout; Envoy's
max_request_headers_kb); request bodies are bounded in size and pace by api/guard.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HEADER_RE, STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from switchyard.api.relay import CONN_KEY
from switchyard.api.safe_headers import safe_response_headers
from switchyard.gateway.runtime import Runtime
from switchyard.pools.deadlines import Deadlines

log = logging.getLogger("switchyard.server")
# Python 3.12's eager tasks: a request whose body came with its headers runs at once, inside the
# read that brought it, up to its first real wait (the upstream's answer), without a turn of the
# loop first (~16 us of a c=1 request's ~500 on a 2-core AMD EPYC, docs/scale.md). On 3.11 the
# task starts on the next turn, as uvicorn starts it.
EAGER_START = sys.version_info >= (3, 12)


@dataclass(frozen=True)
class ServerLimits:
    """Defaults a reviewer of an internet-facing proxy would accept (nginx/Envoy's order of size)."""

    header_timeout: float = 10.0  # from connect (or the end of the last response) to a request's full headers
    max_header_bytes: int = 64 * 1024  # request line + headers (Envoy: 60 KiB; nginx: 4 x 8 KiB)
    body_timeout: float = 30.0  # longest wait for the next piece of a request body (nginx: 60 s)
    client_timeout: float = 30.0  # a response write that makes no progress this long ends the request
    keep_alive: float = 5.0  # idle keep-alive connections close after this (uvicorn's default)
    max_connections: int = 1024  # open connections + requests; beyond it, 503 (uvicorn limit_concurrency)


class GatewayServerConfig(uvicorn.Config):
    """uvicorn's config plus our limits, and a hook counting clients that stopped reading."""

    def __init__(self, app: Any, limits: ServerLimits, on_client_stall: Callable[[], None], **kw: Any) -> None:
        super().__init__(app, http=GuardedHttpProtocol, timeout_keep_alive=int(max(1, limits.keep_alive)),
                         limit_concurrency=limits.max_connections, **kw)
        self.limits = limits
        self.on_client_stall = on_client_stall
        self.deadlines: Deadlines | None = None  # the connections' header and keep-alive times, made on the loop


class GuardedHttpProtocol(HttpToolsProtocol):
    def __init__(self, config: GatewayServerConfig, *args: Any, **kw: Any) -> None:
        super().__init__(config, *args, **kw)
        self._limits = config.limits
        self._on_stall = config.on_client_stall
        d = config.deadlines
        if d is None or d.loop is not self.loop:
            d = config.deadlines = Deadlines(self.loop)
        self._deadlines = d
        # One deadline a connection: the header time ("headers": from connect, or from the end of
        # the last answer, until a request's headers are complete), uvicorn's keep-alive time
        # ("keep-alive": idle after an answer, until data comes), or none while a request is served.
        self._waiting: str | None = None
        self._header_due = 0.0
        self._stall_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._in_headers = False  # inside on_headers_complete: the request's task waits for its body
        self._pending: tuple[Any, Any] | None = None  # (cycle, app) whose task starts once the body is in
        # Set by the request being served while it waits (api/proxy.py, api/relay.py): called once
        # if the client goes, so no request needs a task of its own that waits for http.disconnect.
        self.on_lost: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_headers(self.loop.time())

    def connection_lost(self, exc: Exception | None) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
        super().connection_lost(exc)
        self._deadlines.clear(self)
        self._waiting = None
        lost, self.on_lost = self.on_lost, None
        if lost is not None and self.cycle is not None and not self.cycle.response_complete:
            lost()

    # A silent socket, or headers sent a byte at a time: close once the header time is up.

    def _arm_headers(self, since: float) -> None:
        self._header_bytes = 0
        self._header_due = since + self._limits.header_timeout
        self._deadlines.set(self, self._header_due, self._header_timeout)
        self._waiting = "headers"

    def _header_timeout(self) -> None:
        self._waiting = None
        self._close("header timeout")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._waiting is None:  # a request pipelined behind one being served
            self._arm_headers(self.loop.time())

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        if self._header_bytes > self._limits.max_header_bytes:
            self._refuse_headers()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4  # counted in line: a call a header is ~1 us at c=1
        if self._header_bytes > self._limits.max_header_bytes:
            self._refuse_headers()
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._waiting is not None:
            self._deadlines.clear(self)
            self._waiting = None
        self.scope[CONN_KEY] = self  # type: ignore[literal-required]
        # The request's cycle writes through a cork: its answer's head leaves with the first piece
        # of its body, one write where uvicorn makes two (the head's write was ~15% of a request).
        real = self.transport
        self.transport = _Corked(real, self.loop)  # type: ignore[assignment]
        self._in_headers = True
        try:
            super().on_headers_complete()
        finally:
            self.transport = real
            self._in_headers = False

    # The request's task starts once its body is in (a body that came with its headers), else at
    # the end of the read that brought the headers, as uvicorn would have started it.

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if self._in_headers:
            self._pending = (cycle, app)
        else:
            super()._start_asgi_task(cycle, app)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        pending, self._pending = self._pending, None
        if pending is not None:
            if EAGER_START:
                ctx = contextvars.Context() if self.config.reset_contextvars else None
                task = asyncio.Task(pending[0].run_asgi(pending[1]), loop=self.loop, context=ctx,
                                    eager_start=True)  # type: ignore[call-arg]
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)
            else:
                super()._start_asgi_task(*pending)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        pending, self._pending = self._pending, None
        if pending is not None:  # the body is still coming
            super()._start_asgi_task(*pending)

    def answer(self, scope: dict[str, Any], status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """A whole answer of known length (the proxy's non-streaming ones, api/replies.Answered) in
        one write, the head built as the cycle's two `send`s would build it (its default headers,
        `connection: close` when the connection ends, the access log line) and the safe-headers
        rule applied here (api/safe_headers.py: that middleware wraps `send`, which this skips).
        At c=1 the two sends' dicts, header loop and the middleware's wrapper took ~25 us of a
        ~500 us path on a 2-core EPYC (docs/scale.md, "The c=1 path, trimmed"). False, and nothing written, where the general
        writer must do it: another request's cycle (pipelined), an answer already started, a
        client gone or not reading, a HEAD request, a header name the writer would refuse."""
        cycle = self.cycle
        if (cycle is None or cycle.scope is not scope or cycle.response_started or cycle.disconnected
                or self.flow.write_paused or scope["method"] == "HEAD"
                or HEADER_RE.search(b"".join([k for k, _ in headers]))):  # one search: a bad byte in any name
            return False
        if cycle.access_log:
            cycle.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), scope["method"],
                                     get_path_with_query_string(scope), scope["http_version"], status)
        out = [STATUS_LINE[status]]
        for k, v in (*cycle.default_headers, *safe_response_headers(headers)):
            out += (k, b": ", v, b"\r\n")
        if not cycle.keep_alive:
            out.append(b"connection: close\r\n")
        out += (b"\r\n", body)
        cycle.response_started = cycle.response_complete = True
        cycle.waiting_for_100_continue = False
        cycle.message_event.set()  # a handler waiting on receive() sees the answer done
        out_t = cycle.transport
        if isinstance(out_t, _Corked):  # a 100 Continue the cork still holds goes first, in this write
            out_t.write_now(b"".join(out))
        else:
            out_t.write(b"".join(out))
        if not cycle.keep_alive:
            out_t.close()
        cycle.on_response()
        return True

    def on_response_complete(self) -> None:
        # uvicorn's, with its keep-alive timer as this connection's deadline. The next request's
        # header time runs from here; an idle connection closes at whichever time comes first.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:  # the next request's headers are in: serve it
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        now = self.loop.time()
        self._header_bytes = 0
        self._header_due = now + self._limits.header_timeout  # armed when data comes (_unset_keepalive_if_required)
        self._deadlines.set(self, min(now + self.timeout_keep_alive, self._header_due), self.timeout_keep_alive_handler)
        self._waiting = "keep-alive"

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this as data arrives (and as the connection goes): no longer idle, the
        # header time goes on.
        if self._waiting == "keep-alive":
            self._deadlines.set(self, self._header_due, self._header_timeout)
            self._waiting = "headers"

    def timeout_keep_alive_handler(self) -> None:
        self._waiting = None
        super().timeout_keep_alive_handler()

    def _refuse_headers(self) -> None:
        self._header_bytes = 0
        msg = b"request headers too large"
        if not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(msg), msg))
            self.transport.close()

    # A client that stops reading a response: its writes stop draining; close after client_timeout,
    # which wakes the relay (the client is gone), so the upstream request is cancelled and the
    # replica's slot freed.

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self._limits.client_timeout, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _stalled(self) -> None:
        self._stall_timer = None
        self._on_stall()
        # abort, not close: close() would wait to flush a buffer the client is not reading.
        log.info("aborting a connection from %s: the client stopped reading", self.client)
        self.transport.abort()

    def _close(self, why: str) -> None:
        if not self.transport.is_closing():
            log.info("closing a connection from %s: %s", self.client, why)
            self.transport.close()


class _Corked:
    """The transport one request's cycle writes to: its first write (the answer's head, or a
    100 Continue) is held until the next write joins it, or until the end of this turn of the
    loop, whichever comes first; every later write goes straight through, in order."""

    __slots__ = ("_t", "_loop", "_held", "_first")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._t = transport
        self._loop = loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._first:
            self._first = False
            self._held = data
            self._loop.call_soon(self.flush)
            return
        held = self._held
        if held is not None:
            self._held = None
            data = held + data
        self._t.write(data)

    def write_now(self, data: bytes) -> None:
        """`data` out at once, after anything held (no flush left scheduled for it)."""
        self._first = False
        held, self._held = self._held, None
        self._t.write(data if held is None else held + data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._t.is_closing():
                self._t.write(held)

    def close(self) -> None:
        self.flush()
        self._t.close()

    def is_closing(self) -> bool:
        return self._t.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


class DrainingServer(uvicorn.Server):
    """SIGTERM: readiness answers 503 at once; keep serving until nothing has been in flight for
    a short quiet spell (or `grace` runs out), so a load balancer stops sending; then uvicorn's
    graceful shutdown lets every open request finish and the process exits. A second signal
    (or SIGINT) exits the usual way."""

    def __init__(self, config: uvicorn.Config, rt: Runtime, grace: float, quiet: float = 0.3):
        super().__init__(config)
        self.rt = rt
        self.grace = grace
        self.quiet = quiet
        self._draining = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig == signal.SIGTERM and not self._draining and self.grace > 0:
            self._draining = True
            self.rt.draining = True
            log.warning("SIGTERM: draining (readiness 503, %d requests in flight)", self.rt.active)
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(lambda: loop.create_task(self._drain()))
            return
        super().handle_exit(sig, frame)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        quiet_since = None
        seen = self.rt.admitted
        while loop.time() < deadline and not self.should_exit:
            now = loop.time()
            if self.rt.active == 0 and self.rt.admitted == seen:
                quiet_since = quiet_since or now
                if now - quiet_since >= self.quiet:
                    break
            else:
                quiet_since, seen = None, self.rt.admitted
            await asyncio.sleep(0.05)
        log.warning("drained: %d requests still in flight, closing the listener and letting them finish",
                    self.rt.active)
        self.should_exit = True


class _NoQueryStrings(logging.Filter):
    """Access log lines without query strings: they may carry tokens or personal data."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0], *args[3:])
        return True


def strip_query_strings_from_access_log() -> None:
    logging.getLogger("uvicorn.access").addFilter(_NoQueryStrings())
