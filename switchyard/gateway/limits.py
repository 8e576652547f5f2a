"""Per-key request and token counting: one-minute windows summed across gateways, and the
tokens an upstream answer used (its `usage`, or an estimate for streams without one)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from switchyard.state.base import CounterDelta

WINDOW = 60.0  # rpm / tpm windows, seconds (fixed windows aligned to the minute)


# --- rate limits ----------------------------------------------------------------------------

@dataclass(slots=True)
class _Window:
    idx: int  # window number (time // WINDOW)
    shared: int = 0  # total across gateways at the last sync (our synced part included)
    pending: int = 0  # ours since the last sync
    sending: int = 0  # ours, in the sync now in flight


class RateLimiter:
    """Fixed one-minute windows per key and kind (r: requests, t: tokens), summed across gateways."""

    def __init__(self) -> None:
        self._w: dict[tuple[str, str], _Window] = {}

    def _window(self, key_id: str, kind: str, idx: int) -> _Window:
        w = self._w.get((key_id, kind))
        if w is None or w.idx != idx:
            w = _Window(idx)
            self._w[(key_id, kind)] = w
        return w

    def used(self, key_id: str, kind: str, now: float) -> int:
        w = self._w.get((key_id, kind))
        if w is None or w.idx != int(now // WINDOW):
            return 0
        return w.shared + w.pending + w.sending

    def add(self, key_id: str, kind: str, n: int, now: float) -> None:
        self._window(key_id, kind, int(now // WINDOW)).pending += n

    def take_deltas(self) -> tuple[list[CounterDelta], list[str]]:
        idx = int(time.time() // WINDOW)
        out: list[CounterDelta] = []
        for (key_id, kind), w in list(self._w.items()):
            if w.idx < idx - 1:
                del self._w[(key_id, kind)]
                continue
            if w.pending:
                w.sending, w.pending = w.pending, 0
                out.append((f"rl:{w.idx}", f"{key_id}:{kind}", w.sending, int(WINDOW * 2000)))
        # Read back the whole minute: every key's totals, those spent only elsewhere included.
        return out, [f"rl:{idx}"]

    def apply_totals(self, deltas: list[CounterDelta], totals: dict[str, dict[str, int]] | None) -> None:
        if totals is None:  # not shared (memory store or Redis away): ours stay local
            for bucket, fld, _, _ in deltas:
                key_id, kind = fld.rsplit(":", 1)
                w = self._w.get((key_id, kind))
                if w is not None and f"rl:{w.idx}" == bucket:
                    w.pending += w.sending
                    w.sending = 0
            return
        for bucket, fields in totals.items():
            idx = int(bucket.rsplit(":", 1)[1])
            for fld, total in fields.items():
                key_id, kind = fld.rsplit(":", 1)
                w = self._window(key_id, kind, idx)
                w.shared = total
                w.sending = 0
        for _, fld, _, _ in deltas:  # a window that just ended: nothing to read back
            key_id, kind = fld.rsplit(":", 1)
            w = self._w.get((key_id, kind))
            if w is not None:
                w.sending = 0


# --- usage from upstream answers ------------------------------------------------------------

_TOTAL = re.compile(rb'"total_tokens"\s*:\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
TAIL = 4096


def usage_tokens(data: bytes) -> int | None:
    """Total tokens of the last `usage` object in `data` (a body, or the tail of an SSE stream)."""
    i = data.rfind(b'"usage"')
    if i < 0:
        return None
    m = _TOTAL.search(data, i)
    if m:
        return int(m.group(1))
    p, c = _PROMPT.search(data, i), _COMPLETION.search(data, i)
    if p or c:
        return (int(p.group(1)) if p else 0) + (int(c.group(1)) if c else 0)
    return None


class _TapContent:
    """Stands in for aiohttp's StreamReader: passes chunks on, keeps the tail and counts events."""

    __slots__ = ("_content", "tail", "events")

    def __init__(self, content: Any, first: bytes):
        self._content = content
        self.tail = first[-TAIL:]
        self.events = first.count(b"data:")

    async def readany(self) -> bytes:
        b = await self._content.readany()
        if b:
            self.events += b.count(b"data:")
            self.tail = (self.tail + b)[-TAIL:]
        return b


class StreamTap:
    """Wraps an upstream aiohttp response for the SSE relay; read `tokens()` when the stream ended."""

    def __init__(self, upstream: Any, first: bytes, prompt_estimate: int):
        self.content = _TapContent(upstream.content, first)
        self.prompt_estimate = prompt_estimate

    def tokens(self) -> tuple[int, bool]:
        """(tokens, estimated). With no usage in the stream: prompt estimate + one token per event."""
        n = usage_tokens(self.content.tail)
        if n is not None:
            return n, False
        events = max(0, self.content.events - 1)  # the last event is [DONE]
        return self.prompt_estimate + events, True
