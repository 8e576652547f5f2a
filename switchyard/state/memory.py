"""In-process StateStore: dictionaries with expiry. The default for a single gateway."""

from __future__ import annotations

import time
from collections import OrderedDict

from switchyard.state.base import CircuitRecord, SessionRecord

MAX_SESSIONS = 200_000


class MemoryStore:
    kind = "memory"

    def __init__(self, max_sessions: int = MAX_SESSIONS):
        self._sessions: OrderedDict[str, tuple[float, SessionRecord]] = OrderedDict()
        self._circuits: dict[str, CircuitRecord] = {}
        self._windows: dict[str, tuple[float, int]] = {}
        self._max = max_sessions

    async def get_session(self, session_id: str) -> SessionRecord | None:
        item = self._sessions.get(session_id)
        if item is None:
            return None
        expires, rec = item
        if expires < time.monotonic():
            del self._sessions[session_id]
            return None
        return rec

    async def put_session(self, session_id: str, record: SessionRecord, ttl: float) -> None:
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

    async def incr_window(self, key: str, amount: int, window: float) -> int:
        now = time.monotonic()
        start, total = self._windows.get(key, (now, 0))
        if now - start >= window:
            start, total = now, 0
        total += amount
        self._windows[key] = (start, total)
        return total

    def healthy(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None
