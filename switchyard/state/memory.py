"""In-process StateStore: dictionaries with expiry. The default for a single gateway."""

from __future__ import annotations

import time
from collections import OrderedDict

from switchyard.state.base import CircuitRecord, CounterDelta, LoadRecord, SessionRecord, SharedView

MAX_SESSIONS = 200_000


class MemoryStore:
    kind = "memory"
    shared = False

    def __init__(self, max_sessions: int = MAX_SESSIONS):
        self._sessions: OrderedDict[str, tuple[float, SessionRecord]] = OrderedDict()
        self._circuits: dict[str, CircuitRecord] = {}
        self._drains: dict[str, str] = {}
        self._windows: dict[str, tuple[float, int]] = {}
        self._max = max_sessions

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return self.get_session_now(session_id)

    def get_session_now(self, session_id: str) -> SessionRecord | None:
        item = self._sessions.get(session_id)
        if item is None:
            return None
        expires, rec = item
        if expires < time.monotonic():
            del self._sessions[session_id]
            return None
        return rec

    def expiry(self, session_id: str) -> float | None:
        """Seconds left before the session expires (None: unknown or gone)."""
        item = self._sessions.get(session_id)
        if item is None:
            return None
        left = item[0] - time.monotonic()
        return left if left > 0 else None

    async def put_session(self, session_id: str, record: SessionRecord, ttl: float) -> None:
        self.put_session_now(session_id, record, ttl)

    def put_session_now(self, session_id: str, record: SessionRecord, ttl: float) -> None:
        self._sessions[session_id] = (time.monotonic() + ttl, record)
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self._max:  # bounded: oldest sessions go first
            self._sessions.popitem(last=False)

    async def list_sessions(self, limit: int = 100) -> dict[str, SessionRecord]:
        now = time.monotonic()
        out = {}
        for sid, (exp, rec) in reversed(self._sessions.items()):
            if exp >= now:
                out[sid] = rec
                if len(out) >= limit:
                    break
        return out

    async def get_circuit(self, replica: str) -> CircuitRecord | None:
        return self._circuits.get(replica)

    async def put_circuit(self, replica: str, record: CircuitRecord) -> None:
        self._circuits[replica] = record

    def circuits(self) -> dict[str, CircuitRecord]:
        return dict(self._circuits)

    async def put_drain(self, replica: str, state: str | None) -> None:
        if state is None:
            self._drains.pop(replica, None)
        else:
            self._drains[replica] = state

    def drains(self) -> dict[str, str]:
        return dict(self._drains)

    async def incr_window(self, key: str, amount: int, window: float) -> int:
        now = time.monotonic()
        start, total = self._windows.get(key, (now, 0))
        if now - start >= window:
            start, total = now, 0
        total += amount
        self._windows[key] = (start, total)
        return total

    async def flush(self) -> None:
        return None

    async def sync(self, inflight: dict[str, int], counters: list[CounterDelta],
                   buckets: list[str], loads: dict[str, LoadRecord] | None = None) -> SharedView | None:
        return None  # nothing is shared: local counts are the whole truth

    def healthy(self) -> bool:
        return True

    def describe(self) -> dict:
        return {"kind": self.kind, "healthy": True, "shared": False}

    async def aclose(self) -> None:
        return None
