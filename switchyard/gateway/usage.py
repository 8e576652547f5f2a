"""Token usage from upstream answers: the `usage` object of a body or of a stream's last events.

Bodies and streams are never parsed whole on the request path: the last `"usage"` key is found
with one bytes search (JSON escapes every quote inside a string, so the key cannot be forged by
content) and only that object is decoded.

`UsageTap` stands between the upstream stream and the SSE relay. It keeps the stream's tail to
read the usage at the end, and, when the gateway added `stream_options.include_usage` for a
client that did not ask for it, removes the one event that carries nothing but usage (OpenAI's
`"choices": []` chunk before `[DONE]`); every other byte passes on unchanged, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

TAIL = 8192  # bytes of a stream kept to find its usage (the usage event is ~200 bytes)
_KEY = b'"usage"'


@dataclass(frozen=True, slots=True)
class Usage:
    prompt: int = 0  # includes the cached tokens, as OpenAI counts them
    completion: int = 0
    cached: int = 0

    @property
    def total(self) -> int:
        return self.prompt + self.completion


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def usage_of(obj: Any) -> Usage | None:
    """A decoded `usage` object -> Usage (None when it is not one)."""
    if not isinstance(obj, dict):
        return None
    prompt, completion = _int(obj.get("prompt_tokens")), _int(obj.get("completion_tokens"))
    if not prompt and not completion:
        total = _int(obj.get("total_tokens"))
        if not total:
            return None
        prompt = total  # a server that reports only a total: count it as prompt, never lose it
    details = obj.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(prompt, completion, min(cached, prompt))


def _object_at(data: bytes, i: int) -> Any:
    """The JSON object that starts at data[i] ('{'), decoded (None if cut off or not JSON).

    Candidate ends are tried at each '}' where the braces balance (a usage object has no
    strings with braces in them; a candidate that is not JSON is passed over), all in C: a
    byte-by-byte scan in Python cost ~10 us an answer."""
    j = data.find(b"}", i)
    while j >= 0:
        raw = data[i:j + 1]
        if raw.count(b"{") == raw.count(b"}"):
            try:
                return orjson.loads(raw)
            except orjson.JSONDecodeError:
                pass
        j = data.find(b"}", j + 1)
    return None


def parse_usage(data: bytes) -> Usage | None:
    """The last `usage` object in `data` (a response body, or the tail of an SSE stream)."""
    i = data.rfind(_KEY)
    while i >= 0:
        j = i + len(_KEY)
        while j < len(data) and data[j] in b" \t\r\n:":
            j += 1
        if j < len(data) and data[j] == 0x7B:
            got = usage_of(_object_at(data, j))
            if got is not None:
                return got
        i = data.rfind(_KEY, 0, i)  # `"usage": null` in a later chunk: look further back
    return None


def _boundary(data: bytes) -> int:
    """Where the last complete SSE event in `data` ends (0: none is complete)."""
    i = data.rfind(b"\n\n")
    j = data.rfind(b"\r\n\r\n")
    return max(i + 2 if i >= 0 else 0, j + 4 if j >= 0 else 0)


def _events(data: bytes) -> list[bytes]:
    """Complete SSE events, each with its blank-line terminator, exactly as received."""
    out = []
    start = 0
    n = len(data)
    while start < n:
        i = data.find(b"\n\n", start)
        j = data.find(b"\r\n\r\n", start)
        ends = [e for e in (i + 2 if i >= 0 else -1, j + 4 if j >= 0 else -1) if e > 0]
        if not ends:
            out.append(data[start:])
            break
        end = min(ends)
        out.append(data[start:end])
        start = end
    return out


def _usage_only(event: bytes) -> bool:
    """An event whose data is a chunk with usage and no choices (the include_usage chunk)."""
    payload = b"\n".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
    if not payload.startswith(b"{"):
        return False
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and obj.get("usage") is not None and not obj.get("choices")


class _TapContent:
    """Stands in for aiohttp's StreamReader in the relay (which only calls readany)."""

    __slots__ = ("_content", "_tap")

    def __init__(self, content: Any, tap: UsageTap):
        self._content = content
        self._tap = tap

    async def readany(self) -> bytes:
        tap = self._tap
        while True:
            b = await self._content.readany()
            out = tap.feed(b)
            if out or not b:  # never answer b"" before the upstream ended: the relay reads it as the end
                return out


class UsageTap:
    """Wraps an upstream aiohttp response for the SSE relay; read `usage()` when the stream ended."""

    def __init__(self, upstream: Any, drop_usage_event: bool):
        self.content = _TapContent(upstream.content, self)
        self.drop = drop_usage_event
        self.tail = b""
        self.events = 0  # `data:` lines seen: one token each when the upstream reports no usage
        self._pending = b""  # an event not yet complete (only while dropping)

    def feed(self, b: bytes) -> bytes:
        """What to pass on of the next upstream bytes (b"" at the end: what is left)."""
        if b:
            self.events += b.count(b"data:")
            self.tail = (self.tail + b)[-TAIL:] if len(b) < TAIL else b[-TAIL:]
        if not self.drop:
            return b
        data = self._pending + b if self._pending else b
        cut = _boundary(data) if b else len(data)
        self._pending = data[cut:]
        out = data[:cut]
        if _KEY in out:  # rare: the last events of a stream
            out = b"".join(e for e in _events(out) if not (_KEY in e and _usage_only(e)))
        return out

    def usage(self) -> Usage | None:
        return parse_usage(self.tail)

    def estimate(self, prompt_estimate: int) -> int:
        """Tokens when the stream carried no usage: the prompt estimate and one per event ([DONE] aside)."""
        return prompt_estimate + max(0, self.events - 1)
