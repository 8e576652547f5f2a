"""The front door's checks on every request, before any handler runs (a pure ASGI middleware).

- Bodies: a Content-Length over the route's limit is refused at once (413); a body without one
  is counted as it arrives, and a body whose next piece takes longer than `body_timeout` ends
  the request (408). The proxy routes take `max_body_bytes`; the UI and admin routes, whose
  bodies are a policy or a login, take `small_body_bytes`.
- Open mode (no API keys: the gateway serves loopback only): the Host must be a loopback name
  or one given with --allowed-host, so a page whose DNS name was rebound to 127.0.0.1 cannot
  reach the gateway; and a request that can change something (any method but GET, HEAD,
  OPTIONS) with an Origin other than the gateway's own is refused, so a page in the user's
  browser cannot apply a policy or send work. Both answer 403, as Jupyter does.
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from switchyard import errors
from switchyard.api import errors as http_errors
from switchyard.api.messages import MESSAGES

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


@dataclass(frozen=True)
class GuardConfig:
    max_body_bytes: int  # the proxy routes (/v1/...)
    small_body_bytes: int = 1 << 20  # everything else: the UI's policy text, a login, an admin call
    body_timeout: float = 30.0
    open_mode: bool = True  # no API keys: loopback Host names only, and no foreign Origin on writes
    check_host: bool = True  # off with --insecure-open (serving a network without keys, on purpose)
    allowed_hosts: frozenset[str] = frozenset()


def host_name(host: str) -> str:
    """'example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(name: str) -> bool:
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


class EdgeGuard:
    def __init__(self, app: ASGIApp, config: GuardConfig) -> None:
        self.app = app
        self.cfg = config
        self.allowed_hosts = frozenset(h.lower() for h in config.allowed_hosts)
        self._hosts: dict[str, bool] = {}  # Host header -> served (a handful of values in practice)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        bounded, refusal = self.admit(scope, receive)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, bounded, send)

    def admit(self, scope: Scope, receive: Receive) -> tuple[Receive, ASGIApp | None]:
        """An HTTP request's checks: (its bounded `receive`, None), or (receive, the refusal to
        send). Synchronous, so a chain can run it without a layer of its own (api/app.py)."""
        cfg = self.cfg
        refusal = self._refuse(scope) if cfg.open_mode else None
        limit = cfg.max_body_bytes if scope["path"].startswith("/v1/") else cfg.small_body_bytes
        if refusal is None:
            cl = _header(scope, b"content-length")
            if cl is not None:
                try:
                    if int(cl) > limit:
                        refusal = errors.TooLarge(limit)
                except ValueError:
                    refusal = errors.BadRequest("invalid Content-Length header")
        if refusal is not None:
            # Each client API reads its own error shape: Claude Code shows Anthropic's message,
            # not an OpenAI envelope it cannot parse.
            shape = MESSAGES if scope["path"].startswith("/v1/messages") else None
            return receive, http_errors.response(refusal, shape=shape)
        return _BoundedBody(receive, limit, cfg.body_timeout), None

    def _served(self, host: str) -> bool:
        ok = self._hosts.get(host)
        if ok is None:
            name = host_name(host)
            ok = bool(name) and (is_loopback(name) or name in self.allowed_hosts)
            if len(self._hosts) < 256:
                self._hosts[host] = ok
        return ok

    def _refuse(self, scope: Scope) -> errors.RequestError | None:
        host = _header(scope, b"host") or ""
        if self.cfg.check_host and not self._served(host):
            return errors.Forbidden(
                f"host {host!r} is not served: without API keys this gateway answers loopback names only "
                "(add one with --allowed-host, or serve with --auth)", code="host_not_allowed")
        if scope["method"] not in SAFE_METHODS:
            origin = _header(scope, b"origin")
            own = f"{scope.get('scheme', 'http')}://{host}"
            if origin is not None and origin.lower() != own.lower():
                return errors.Forbidden(
                    f"origin {origin!r} may not change anything here: without API keys only the gateway's "
                    "own pages and clients that send no Origin (SDKs, curl) may", code="origin_not_allowed")
        return None


class _BoundedBody:
    """`receive` that counts body bytes against a limit and waits at most `timeout` for each piece.
    Once the body is complete it passes through untouched (a handler may wait on disconnect)."""

    __slots__ = ("_receive", "_limit", "_timeout", "_seen", "_done")

    def __init__(self, receive: Receive, limit: int, timeout: float) -> None:
        self._receive = receive
        self._limit = limit
        self._timeout = timeout
        self._seen = 0
        self._done = False

    def whole(self) -> bytes | None:
        """The whole body now, when uvicorn's cycle already holds all of it (a small body arrives
        with its headers): what the first receive() would hand over, counted the same, without its
        three coroutines (a few us of a request's ~0.5 ms at c=1). None where receive() must do it."""
        cycle = getattr(self._receive, "__self__", None)
        if (self._done or self._seen or not isinstance(cycle, RequestResponseCycle) or cycle.more_body
                or cycle.waiting_for_100_continue or cycle.disconnected or cycle.response_complete):
            return None
        cycle.flow.resume_reading()
        cycle.message_event.clear()
        body, cycle.body = bytes(cycle.body), bytearray()
        self._done = True
        self._seen = len(body)
        if self._seen > self._limit:
            raise errors.TooLarge(self._limit)
        return body

    async def __call__(self) -> Message:
        receive = self._receive
        if self._done:
            return await receive()
        # uvicorn's receive answers at once when its cycle already holds the data (a small body
        # arrives with its headers): no timer for that wait. Any other wait is timed.
        ready = getattr(getattr(receive, "__self__", None), "message_event", None)
        if ready is not None and ready.is_set():
            msg = await receive()
        else:
            try:
                async with asyncio.timeout(self._timeout):
                    msg = await receive()
            except TimeoutError:
                raise errors.RequestTimeout(
                    f"the request body stalled: no data for {self._timeout:g}s") from None
        if msg["type"] == "http.request":
            self._seen += len(msg.get("body", b""))
            if self._seen > self._limit:
                raise errors.TooLarge(self._limit)
            if not msg.get("more_body", False):
                self._done = True
        else:
            self._done = True
        return msg

