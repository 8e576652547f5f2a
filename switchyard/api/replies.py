"""What the proxy hands the server for an answer: `Answered`, a whole non-streaming answer, and
`Translated`, an upstream chat stream rendered in the client's API as it is relayed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from switchyard.api.dialect import StreamTranslator
from switchyard.api.relay import CONN_KEY
from switchyard.gateway.usage import UsageTap


class Answered(Response):
    """A non-streaming answer, its headers built once (Starlette's Response lowercases and
    re-encodes its headers in init_headers, per request). Under our server (the scope names its
    connection) head and body leave in one write of the connection's (api/server.py's `answer`,
    which applies api/safe_headers.py's rule itself: the fast chain's only wrapper of `send`);
    elsewhere they go as two ASGI messages.
    `after` runs once the body is handed to the server, however the sending ends: what Starlette's
    `background` is for, without a task. An answer the socket takes at once (all but the largest)
    is followed by `after` within the same turn of the loop: no other request can see the gap."""

    def __init__(self, body: bytes, status: int, headers: dict[str, str], media_type: str,
                 after: Callable[[], None] | None = None) -> None:
        self.body = body
        self.status_code = status
        self.background = None
        self.after = after
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw.append((b"content-length", str(len(body)).encode()))
        if media_type.startswith("text/") and "charset=" not in media_type.lower():
            media_type += "; charset=utf-8"  # as Starlette's Response does
        raw.append((b"content-type", media_type.encode("latin-1")))
        self.raw_headers = raw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            conn = scope.get(CONN_KEY)  # our server writes it whole (api/server.py's answer)
            if conn is None or not conn.answer(scope, self.status_code, self.raw_headers, self.body):
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                await send({"type": "http.response.body", "body": self.body})
        finally:
            if self.after is not None:
                self.after()


class Translated:
    """Stands in for aiohttp's StreamReader in the relay (which only calls readany): the upstream's
    chat SSE (through the usage tap) in the client's API. At the upstream's clean end it awaits
    `on_end` (a stored response) before the closing events go out."""

    __slots__ = ("_ended", "_on_end", "_tap", "_translator", "content")

    def __init__(self, tap: UsageTap, translator: StreamTranslator,
                 on_end: Callable[[], Awaitable[None]] | None) -> None:
        self.content = self
        self._tap = tap.content
        self._translator = translator
        self._on_end = on_end
        self._ended = False

    async def readany(self) -> bytes:
        while not self._ended:
            b = await self._tap.readany()
            if not b:
                self._ended = True
                out = self._translator.close()
                if self._on_end is not None:
                    await self._on_end()
                return out
            out = self._translator.feed(b)
            if out:  # never b"" before the end: the relay reads it as the end
                return out
        return b""
