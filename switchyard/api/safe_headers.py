"""Every response leaves with `x-content-type-options: nosniff` and header values a client parses.

A pure ASGI wrapper of `send` (no per-request objects beyond one closure): a browser never
sniffs an answer into HTML on our origin, and a control byte in a header value (from a policy
name, an upstream, anywhere) is replaced instead of reaching the HTTP writer, which would drop
the connection mid-response.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

NOSNIFF = (b"x-content-type-options", b"nosniff")
_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def clean_value(v: bytes) -> bytes:
    return _BAD.sub(b"?", v) if _BAD.search(v) else v


def safe_response_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """An answer's headers as they may leave: values cleaned, nosniff set once."""
    raw = list(raw)
    # One search over every value at once (the values of one answer are a few hundred bytes);
    # the header-by-header pass only when something must be replaced.
    if _BAD.search(b"\t".join(v for _, v in raw)):  # a tab is allowed: it cannot match
        headers = [(k, clean_value(v)) for k, v in raw if k != b"x-content-type-options"]
    else:
        headers = [h for h in raw if h[0] != b"x-content-type-options"]
    headers.append(NOSNIFF)
    return headers


def safe_send(send: Send) -> Send:
    """`send` with every answer's head made safe (safe_response_headers)."""

    async def send_safe(msg: Message) -> None:
        if msg["type"] == "http.response.start":
            msg["headers"] = safe_response_headers(msg.get("headers", ()))
        await send(msg)

    return send_safe


class SafeHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, safe_send(send) if scope["type"] == "http" else send)
