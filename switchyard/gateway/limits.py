"""Per-key request and token counting: one-minute windows summed across gateways (the tokens
an answer used come from gateway/usage.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

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
