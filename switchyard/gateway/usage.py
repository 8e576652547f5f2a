"""Token usage from upstream answers: the `usage` object of a body or of a stream's last events.

Bodies and streams are never parsed whole on the request path: the last `"usage"` key is found
with one bytes search (JSON escapes every quote inside a string, so the key cannot be forged by
content) and only that object is decoded.

`UsageTap` stands between the upstream stream and the SSE relay. It keeps the stream's tail to
read the usage at the end, and, when the gateway added `stream_options.include_usage` for a
client that did not ask for it, removes the one event that carries nothing but usage (OpenAI's
`"choices": []` chunk before `[DONE]`); every other byte passes on unchanged, in order, as it
comes (an event is held back only while it could still be that ~300-byte chunk). The tap bounds
what one upstream event may be (`max_event_bytes`) and knows a stream that stopped without its
final event (a close-delimited answer cut midway): both end the stream as a failure
(`StreamBroken`, an aiohttp payload error, so the relay sends the client's API's error event).

All of it is linear in what the upstream sends and bounded per call: a body's usage is looked for
in its last `USAGE_WINDOW` bytes, a usage object is at most `MAX_USAGE_OBJECT` bytes, and a
stream's boundaries are looked for in each new chunk only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

TAIL = 8192  # bytes of a stream kept to find its usage (the usage event is ~200 bytes)
USAGE_WINDOW = 64 * 1024  # a body's usage is in its last bytes (after choices / output / content)
MAX_USAGE_OBJECT = 4096  # a usage object is ~100-400 bytes
MAX_USAGE_KEYS = 16  # `"usage"` keys tried, the last first (`"usage": null` chunks before the real one)
HOLD = 4096  # an open event longer than this cannot be the usage-only chunk: it passes on as it comes
MAX_EVENT_BYTES = 1 << 20  # one upstream SSE event at most (default; UsageTap's max_event_bytes)
# How a well-ended stream ends: chat and completions with `data: [DONE]`; Responses and Messages
# with a last event named one of FINAL_EVENTS (an upstream's own error event included). Both are
# looked for after a line break, so an answer's text cannot fake them (JSON escapes line breaks).
FINAL_EVENTS = frozenset({b"response.completed", b"response.failed", b"response.incomplete", b"message_stop",
                          b"error"})
_KEY = b'"usage"'
_BRACES = re.compile(rb"[{}]")


class StreamBroken(aiohttp.ClientPayloadError):
    """An upstream stream the gateway ends as failed: an event over the size cap, or a stream that
    stopped before its final event. A ClientPayloadError, as a broken chunked body is: the relay
    treats both the same way (the API's error event, a failure counted against the replica)."""


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
    if not prompt and not completion and ("input_tokens" in obj or "output_tokens" in obj):
        return _native_usage(obj)  # an answer passed through in the client's own API
    if not prompt and not completion:
        total = _int(obj.get("total_tokens"))
        if not total:
            return None
        prompt = total  # a server that reports only a total: count it as prompt, never lose it
    details = obj.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(prompt, completion, min(cached, prompt))


def _native_usage(obj: dict) -> Usage | None:
    """Responses' usage (input_tokens with input_tokens_details.cached_tokens, as OpenAI counts) or
    Anthropic's (input_tokens without the cache reads and writes, cache_read_input_tokens beside)."""
    prompt, completion = _int(obj.get("input_tokens")), _int(obj.get("output_tokens"))
    details = obj.get("input_tokens_details")
    if isinstance(details, dict):
        cached = _int(details.get("cached_tokens"))
    else:
        cached = _int(obj.get("cache_read_input_tokens"))
        prompt += cached + _int(obj.get("cache_creation_input_tokens"))
    if not prompt and not completion:
        return None
    return Usage(prompt, completion, min(cached, prompt))


def _object_at(data: bytes, i: int) -> Any:
    """The JSON object that starts at data[i] ('{'), decoded (None if cut off, too long or not JSON).

    One forward pass over the braces of at most MAX_USAGE_OBJECT bytes (a usage object has no
    strings with braces in them), then one decode: linear, where trying every '}' as an end and
    counting braces again each time was quadratic (128 KB of braces: 15-28 s)."""
    depth = 0
    for m in _BRACES.finditer(data, i, min(len(data), i + MAX_USAGE_OBJECT)):
        depth += 1 if data[m.start()] == 0x7B else -1
        if depth == 0:
            try:
                return orjson.loads(data[i:m.end()])
            except orjson.JSONDecodeError:
                return None
    return None


def parse_usage(data: bytes) -> Usage | None:
    """The last `usage` object in `data` (a response body, or the tail of an SSE stream), looked
    for in its last USAGE_WINDOW bytes."""
    lo = max(0, len(data) - USAGE_WINDOW)
    i = data.rfind(_KEY, lo)
    tries = 0
    while i >= 0 and tries < MAX_USAGE_KEYS:
        tries += 1
        j = i + len(_KEY)
        while j < len(data) and data[j] in b" \t\r\n:":
            j += 1
        if j < len(data) and data[j] == 0x7B:
            got = usage_of(_object_at(data, j))
            if got is not None:
                return got
        i = data.rfind(_KEY, lo, i)  # `"usage": null` in a later chunk: look further back
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
            if tap.broken:
                raise StreamBroken(tap.broken)
            b = await self._content.readany()
            out = tap.feed(b)
            if tap.broken:
                raise StreamBroken(tap.broken)
            if not b and tap.cut():
                raise StreamBroken("the upstream's stream stopped before its final event (cut midway)")
            if out or not b:  # never answer b"" before the upstream ended: the relay reads it as the end
                return out


class UsageTap:
    """Wraps an upstream aiohttp response for the SSE relay; read `usage()` when the stream ended.

    `max_event_bytes` caps one event (beyond it `broken` says why, `feed` passes nothing more and
    the next read raises StreamBroken, so the first chunk's feed needs no handler); `final_events`
    are the event names a well-ended named-event stream ends with (FINAL_EVENTS: every client API's)."""

    def __init__(self, upstream: Any, drop_usage_event: bool, max_event_bytes: int = MAX_EVENT_BYTES,
                 final_events: frozenset[bytes] = FINAL_EVENTS):
        self.content = _TapContent(upstream.content, self)
        self.drop = drop_usage_event
        self.max_event = max_event_bytes
        self.final_events = final_events
        headers = getattr(upstream, "headers", None)
        ctype = headers.get("Content-Type", "") if headers is not None else ""
        # Only an event stream has a final event to miss (an upstream that answered JSON has none).
        self.sse = not ctype or "event-stream" in ctype
        self.tail = b""
        self.events = 0  # `data:` lines seen: one token each when the upstream reports no usage
        self.last_event = b""  # the name of the last `event:` line seen (named-event streams)
        self.broken = ""  # why the stream is ended as failed (an event over the cap)
        self._pending = b""  # held back: an open event that may be the usage-only chunk (at most HOLD)
        self._open = 0  # bytes of the event now open (since the last blank line)
        self._edge = b"\n"  # the last bytes seen: a boundary or final event split between chunks is found
        self._passing = False  # the open event was let through before its end (longer than HOLD)

    def feed(self, b: bytes) -> bytes:
        """What to pass on of the next upstream bytes (b"" at the end: what is left)."""
        if self.broken:
            return b""
        if not b:
            out, self._pending = self._pending, b""
            return out
        self.events += b.count(b"data:")
        self.tail = (self.tail + b)[-TAIL:] if len(b) < TAIL else b[-TAIL:]
        scan = self._edge + b
        i = scan.rfind(b"\nevent:")
        if i >= 0:  # one search a chunk; a name not yet ended by its newline is read on the next chunk
            j = scan.find(b"\n", i + 7)
            if j >= 0:
                self.last_event = scan[i + 7:j].strip()
        k = _boundary(scan)
        self._open = len(scan) - k if k else self._open + len(b)
        self._edge = scan[-64:]
        if self._open > self.max_event:
            self.broken = (f"an upstream SSE event is larger than {self.max_event} bytes "
                           "(the gateway's --max-event-mb)")
            self._pending = b""
            return b""
        if not self.drop:
            return b
        data = self._pending + b if self._pending else b
        cut = _boundary(data)
        continued = self._passing
        if len(data) - cut > HOLD or (continued and not cut):
            out, self._pending, self._passing = data, b"", True  # not the usage chunk: let it through
        else:
            out, self._pending, self._passing = data[:cut], data[cut:], False
        if _KEY in out:  # rare: the last events of a stream
            events = _events(out)
            head = [events.pop(0)] if continued and events else []  # the rest of an event already passing
            out = b"".join(head + [e for e in events if not (_KEY in e and _usage_only(e))])
        return out

    def cut(self) -> bool:
        """The upstream ended an event stream without its final event (after every byte was fed):
        no `data: [DONE]` near its end, and no last event of a final name that was complete."""
        if not self.sse:
            return False
        end = b"\n" + self.tail[-256:]
        if b"\ndata: [DONE]" in end or b"\ndata:[DONE]" in end:
            return False
        complete = self.tail.endswith((b"\n\n", b"\r\n\r\n"))
        return not (complete and self.last_event in self.final_events)

    def usage(self) -> Usage | None:
        return parse_usage(self.tail)

    def estimate(self, prompt_estimate: int) -> int:
        """Tokens when the stream carried no usage: the prompt estimate and one per event ([DONE] aside)."""
        return prompt_estimate + max(0, self.events - 1)
