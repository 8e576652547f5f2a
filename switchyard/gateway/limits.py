"""Per-key request and token counting: one-minute windows summed across gateways (the tokens
an answer used come from gateway/usage.py).

Tokens are reserved at admission (the prompt, counted from the parsed body, plus the answer's
`max_tokens`, capped) and settled against what was spent when the request ends, so concurrent
requests cannot each see an empty window and together spend many times the limit."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from switchyard.state.base import CounterDelta

WINDOW = 60.0  # rpm / tpm windows, seconds (fixed windows aligned to the minute)
COMPLETION_RESERVE = 256  # tokens reserved for an answer that gives no max_tokens
MAX_COMPLETION_RESERVE = 4096  # ... and at most, whatever max_tokens says (agents send 32000)


def reserve_estimate(prompt_tokens: int, max_tokens: Any) -> int:
    """Tokens to reserve for a request: its prompt and its answer's budget, capped."""
    ok = isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0
    return max(0, prompt_tokens) + (min(max_tokens, MAX_COMPLETION_RESERVE) if ok else COMPLETION_RESERVE)


@dataclass(slots=True)
class Reservation:
    """Tokens charged to a key at admission, until the request ends (`RateLimiter.settle`)."""

    key_id: str
    tokens: int
    idx: int  # the window they were charged to
    settled: bool = False


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
        self._reserved: dict[str, int] = {}  # key id -> tokens reserved by its requests in flight here

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

    def reserve(self, key_id: str, tokens: int, now: float) -> Reservation:
        self.add(key_id, "t", tokens, now)
        self._reserved[key_id] = self._reserved.get(key_id, 0) + tokens
        return Reservation(key_id, tokens, int(now // WINDOW))

    def outstanding(self, key_id: str) -> int:
        """Tokens reserved by this key's requests still in flight on this gateway."""
        return self._reserved.get(key_id, 0)

    def settle(self, res: Reservation, spent: int, now: float) -> None:
        """Replace a reservation by what was spent (once). In the same window the difference is
        charged (a refund when less was spent); a window later the reservation stays where it was
        charged and only what was spent beyond it lands in the new window."""
        if res.settled:
            return
        res.settled = True
        left = self._reserved.get(res.key_id, 0) - res.tokens
        if left > 0:
            self._reserved[res.key_id] = left
        else:
            self._reserved.pop(res.key_id, None)
        idx = int(now // WINDOW)
        delta = spent - res.tokens if idx == res.idx else max(0, spent - res.tokens)
        if delta:
            self._window(res.key_id, "t", idx).pending += delta

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
