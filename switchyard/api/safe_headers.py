"""Every response leaves with `x-content-type-options: nosniff` and header values a client parses.

A pure ASGI wrapper of `send` (no per-request objects beyond one closure): a browser never
sniffs an answer into HTML on our origin, and a control byte in a header value (from a policy
name, an upstream, anywhere) is replaced instead of reaching the HTTP writer, which would drop
the connection mid-response.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

NOSNIFF = (b"x-content-type-options", b"nosniff")
_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def clean_value(v: bytes) -> bytes:
    return _BAD.sub(b"?", v) if _BAD.search(v) else v


class SafeHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_safe(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                raw = msg.get("headers", ())
                # One search over every value at once (the values of one answer are a few hundred
                # bytes); the header-by-header pass only when something must be replaced.
                if _BAD.search(b"\t".join(v for _, v in raw)):  # a tab is allowed: it cannot match
                    headers = [(k, clean_value(v)) for k, v in raw if k != b"x-content-type-options"]
                else:
                    headers = [h for h in raw if h[0] != b"x-content-type-options"]
                headers.append(NOSNIFF)
                msg["headers"] = headers
            await send(msg)

        await self.app(scope, receive, send_safe)
