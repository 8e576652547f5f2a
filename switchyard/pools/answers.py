"""What may come back from an upstream, and in what form: checks on an answer before it is relayed.

An upstream is trusted to serve models, not to write our responses: its Content-Type is limited
to what an API answer is (JSON, SSE, plain text) and rebuilt from its parts (no byte of the
upstream's value reaches our headers), its body is bounded, a 2xx that is an error in disguise
is called one, and the credentials the gateway sent it never come back to a client through it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

DEFAULT_MAX_BODY = 32 * 1024 * 1024  # a non-stream answer; a real one is kilobytes
REDACTED = b"<redacted>"

# Media types an answer of the three client APIs can have; anything else (text/html from a
# proxy's error page, images, javascript) is an upstream error, never relayed on our origin.
ALLOWED_TYPES = frozenset({"application/json", "text/event-stream", "text/plain"})
_TYPE = re.compile(r"^\s*([A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+)\s*(;.*)?$", re.S)
_CHARSET = re.compile(r";\s*charset\s*=\s*\"?([A-Za-z0-9_.:-]{1,40})\"?", re.I)
DECODED_ENCODINGS = frozenset({"", "identity", "gzip", "x-gzip", "deflate"})  # what aiohttp decodes here


class BodyTooLarge(Exception):
    def __init__(self, limit: int, seen: int):
        self.limit = limit
        self.seen = seen
        super().__init__(f"the answer is over {limit:,} bytes")


_TYPES_SEEN: dict[str, str | None] = {}  # raw value -> content_type(raw): upstreams send a handful


def content_type(raw: str | None) -> str | None:
    """The Content-Type to relay (rebuilt: type and charset only), or None when it is not one an API
    answer has. No Content-Type at all reads as JSON, as the proxies always assumed."""
    if raw is None:
        return "application/json"
    try:
        return _TYPES_SEEN[raw]
    except KeyError:
        pass
    out = _content_type(raw)
    if len(_TYPES_SEEN) < 256:
        _TYPES_SEEN[raw] = out
    return out


def _content_type(raw: str) -> str | None:
    m = _TYPE.match(raw)
    if m is None:
        return None
    media = m.group(1).lower()
    if media not in ALLOWED_TYPES and not (media.startswith("application/") and media.endswith("+json")):
        return None
    if media not in ALLOWED_TYPES:
        media = "application/json"
    cs = _CHARSET.search(m.group(2) or "")
    return f"{media}; charset={cs.group(1).lower()}" if cs else media


def shown_type(raw: str | None) -> str:
    """An upstream's Content-Type as a log line or an error message may show it."""
    return (raw or "")[:60].encode("ascii", "backslashreplace").decode()


def undecodable(resp: aiohttp.ClientResponse) -> str | None:
    """A Content-Encoding the client session cannot decode (the bytes would go out mislabelled)."""
    enc = resp.headers.get("Content-Encoding", "").strip().lower()
    return None if enc in DECODED_ENCODINGS else enc[:40]


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole (decoded) body, or BodyTooLarge as soon as it passes `limit` bytes."""
    declared = resp.content_length
    if declared is not None and declared > limit and not resp.headers.get("Content-Encoding"):
        raise BodyTooLarge(limit, declared)
    ready = getattr(resp.content, "ready", None)  # the request path's client: no await once it is all here
    whole = ready() if ready is not None else None
    if whole is not None:
        if len(whole) > limit:
            raise BodyTooLarge(limit, len(whole))
        return whole
    parts: list[bytes] = []
    seen = 0
    while True:
        chunk = await resp.content.read(1 << 20)
        if not chunk:
            break
        seen += len(chunk)
        if seen > limit:
            raise BodyTooLarge(limit, seen)
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def error_of(body: bytes) -> str | None:
    """The message of a 2xx body that is an error in disguise (`{"error": {...}}`, Anthropic's
    `{"type": "error", ...}`), None for an answer. A Responses object carries `"error": null`:
    only a set error without any output counts."""
    if b'"error"' not in body:
        return None
    try:
        obj: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not obj.get("error"):
        return None
    if obj.get("choices") or obj.get("output") or obj.get("content"):
        return None
    err = obj["error"]
    msg = err.get("message") if isinstance(err, dict) else err
    return str(msg)[:200]


def stream_error_of(first: bytes) -> str | None:
    """The message when a stream's first bytes are an error event and no answer (`data: {"error"...`,
    or a bare JSON error body sent with status 200)."""
    head = first.lstrip()
    if head.startswith(b"data:"):
        line = head[5:].split(b"\n", 1)[0].strip()
        return error_of(line) if line.startswith(b"{") else None
    if head.startswith(b"event: error"):
        return "an error event"
    return error_of(first) if head.startswith(b"{") else None


@dataclass(frozen=True, slots=True)
class Scrubber:
    """Takes the credentials the gateway sent upstream out of what the upstream sends back."""

    secrets: tuple[bytes, ...]

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def bytes(self, data: bytes) -> bytes:
        for s in self.secrets:
            if s in data:
                data = data.replace(s, REDACTED)
        return data

    def held_back(self, data: bytes) -> int:
        """How many of `data`'s last bytes could begin a secret (kept until the next chunk)."""
        best = 0
        for s in self.secrets:
            for n in range(min(len(s) - 1, len(data)), best, -1):
                if data.endswith(s[:n]):
                    best = n
                    break
        return best


def scrubber_for(upstream_headers: dict[str, str], auth: aiohttp.BasicAuth | None) -> Scrubber:
    """The secrets of one attempt: the pool's Bearer key; a replica URL's password and its Basic form."""
    out: list[bytes] = []
    bearer = upstream_headers.get("Authorization", "")
    if bearer[:7].lower() == "bearer " and len(bearer) > 11:
        out.append(bearer[7:].strip().encode())
    if auth is not None:
        if len(auth.password) >= 4:
            out.append(auth.password.encode())
        out.append(auth.encode().split(" ", 1)[1].encode())
    return Scrubber(tuple(sorted(set(out), key=len, reverse=True)))


class _ScrubbedContent:
    def __init__(self, content: aiohttp.StreamReader, scrub: Scrubber):
        self._content = content
        self._scrub = scrub
        self._held = b""

    async def readany(self) -> bytes:
        while True:
            chunk = await self._content.readany()
            if not chunk:
                out, self._held = self._scrub.bytes(self._held), b""
                return out
            data = self._scrub.bytes(self._held + chunk)
            keep = self._scrub.held_back(data)
            out, self._held = (data[:-keep], data[-keep:]) if keep else (data, b"")
            if out:
                return out


class ScrubbedStream:
    """An upstream stream whose chunks pass through a Scrubber; a chunk whose tail could begin a
    secret keeps that tail until the next chunk (SSE chunks end in a blank line: none is held)."""

    def __init__(self, resp: aiohttp.ClientResponse, scrub: Scrubber):
        self._resp = resp
        self.content = _ScrubbedContent(resp.content, scrub)

    def release(self) -> Any:
        return self._resp.release()

    def close(self) -> None:
        self._resp.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resp, name)

