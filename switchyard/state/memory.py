"""In-process StateStore: bounded dictionaries with expiry. The default for a single gateway.

Sessions are the bulk of it (one per live agent: hundreds of thousands). Each is kept as one
packed bytes value (expiry, confidence, turns, and the indices of its policy/pool/label/rule/
replica names in a table of strings) under its key, in its caller's LRU: ~250 bytes a session
with a uuid id, and nothing the cyclic GC tracks, so a full collection does not walk them
(200k dataclass records in tuples cost ~70 ms a gen-2 pass, issue #34).
"""

from __future__ import annotations

import logging
import struct
import time

from switchyard.state.base import (
    MAX_RESPONSE_BYTES,
    MAX_RESPONSES_MEMORY,
    MAX_RESPONSES_PER_CALLER,
    CircuitRecord,
    CounterDelta,
    LoadRecord,
    SessionRecord,
    SharedView,
    session_caller,
)
from switchyard.state.bounded import OwnedLRU

log = logging.getLogger("switchyard.state.memory")

MAX_SESSIONS = 200_000
RESPONSE_OVERHEAD = 200  # bytes an entry costs beyond its record (key, tuple, dict slots)

# recency bucket (state/bounded.py), expiry (monotonic), confidence (float32: 1e-7 is below any
# threshold a rule sets), turns, then five string slots: policy, pool, label, rule, replica. 30
# bytes: a bytes object of 63, one 64-byte block.
_SESSION = struct.Struct("<IdfI5H")
_BUCKET = struct.Struct("<I")
_HEAD = 12  # bytes of bucket and expiry: what differs between sessions of the same content
_RECORDS = 4096
_EXPIRY = struct.Struct("<4xd")
_NONE = 0xFFFF  # the slot holds None
_INLINE = 0xFFFE  # the string follows the fixed part (length-prefixed): the table is full
_MAX_STRINGS = 0xFFF0


class _Strings:
    """Names a session refers to (policies, pools, labels, rules, replica URLs) come from the
    policies, a few hundred at most: each kept once, sessions hold its index."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}

    def ix(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            if len(self.names) >= _MAX_STRINGS:
                return _INLINE
            i = self.index[s] = len(self.names)
            self.names.append(s)
        return i


def _pack(strs: _Strings, rec: SessionRecord, expires: float, bucket: int) -> bytes:
    g = strs.index.get
    p, pl, lb, ru = g(rec.policy), g(rec.pool), g(rec.label), g(rec.rule)
    rp = _NONE if rec.replica is None else g(rec.replica)
    turns = rec.turns if rec.turns <= 0xFFFFFFFF else 0xFFFFFFFF
    if p is None or pl is None or lb is None or ru is None or rp is None:  # a name not seen yet
        return _pack_new(strs, rec, expires, bucket, turns)
    return _SESSION.pack(bucket, expires, rec.confidence, turns, p, pl, lb, ru, rp)


def _pack_new(strs: _Strings, rec: SessionRecord, expires: float, bucket: int, turns: int) -> bytes:
    slots = []
    tail = b""
    for s in (rec.policy, rec.pool, rec.label, rec.rule, rec.replica):
        if s is None:
            slots.append(_NONE)
            continue
        i = strs.ix(s)
        if i == _INLINE:
            raw = s.encode()
            tail += len(raw).to_bytes(4, "little") + raw
        slots.append(i)
    return _SESSION.pack(bucket, expires, rec.confidence, turns, *slots) + tail


def _unpack(strs: _Strings, raw: bytes) -> SessionRecord:
    if len(raw) != _SESSION.size:
        return _unpack_inline(strs, raw)
    _, _, conf, turns, p, pl, lb, ru, rp = _SESSION.unpack_from(raw)
    n = strs.names
    return SessionRecord(n[p], n[pl], n[lb], conf, None if rp == _NONE else n[rp], n[ru], turns)


def _unpack_inline(strs: _Strings, raw: bytes) -> SessionRecord:
    """A record with names past the table's end written in full after the fixed part."""
    _, _, conf, turns, *slots = _SESSION.unpack_from(raw)
    off = _SESSION.size
    vals: list[str | None] = []
    for i in slots:
        if i == _NONE:
            vals.append(None)
        elif i == _INLINE:
            n = int.from_bytes(raw[off:off + 4], "little")
            vals.append(raw[off + 4:off + 4 + n].decode())
            off += 4 + n
        else:
            vals.append(strs.names[i])
    policy, pool, label, rule, replica = vals
    return SessionRecord(policy or "", pool or "", label or "", conf, replica, rule or "", turns)


def _expiry(raw: bytes) -> float:
    return _EXPIRY.unpack_from(raw)[0]


def _bucket(raw: bytes) -> int:
    return _BUCKET.unpack_from(raw)[0]


# A stored response: (recency bucket, expiry, the record). Few enough (bounded by bytes) that a tuple will do.
Stored = tuple[int, float, bytes]


def _response_bucket(v: Stored) -> int:
    return v[0]


def _response_weight(v: Stored) -> int:
    return len(v[2]) + RESPONSE_OVERHEAD


class MemoryStore:
    kind = "memory"
    shared = False

    def __init__(self, max_sessions: int = MAX_SESSIONS, max_sessions_per_caller: int | None = None, *,
                 max_responses_per_caller: int = MAX_RESPONSES_PER_CALLER,
                 max_response_bytes: int = MAX_RESPONSE_BYTES, max_responses_memory: int = MAX_RESPONSES_MEMORY):
        # Per caller: a caller over its cap loses its own oldest; at the total, the caller holding
        # the most does (state/bounded.py), so one tenant's fresh ids never evict another's.
        self._sessions: OwnedLRU[bytes] = OwnedLRU(max_sessions_per_caller or max_sessions, max_sessions, _bucket)
        self._strs = _Strings()
        self._records: dict[bytes, SessionRecord] = {}  # packed content -> its record (a bounded cache)
        self._puts = 0
        self._responses: OwnedLRU[Stored] = OwnedLRU(
            max_responses_per_caller, max_responses_memory, _response_bucket, _response_weight)
        self.max_response_bytes = min(max_response_bytes, max_responses_memory - RESPONSE_OVERHEAD)
        self._circuits: dict[str, CircuitRecord] = {}
        self._drains: dict[str, str] = {}
        self._windows: dict[str, tuple[float, int, float]] = {}  # key -> (start, total, window)
        self._windows_swept = 0  # size of _windows after its last sweep
        self._max = max_sessions

    # --- sessions ---------------------------------------------------------------------------

    def session_count(self) -> int:
        return self._sessions.weight

    def session_owners(self) -> dict[str, int]:
        """caller -> live-or-not-yet-swept sessions held."""
        return self._sessions.owners()

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return self.get_session_now(session_id)

    def get_session_now(self, session_id: str) -> SessionRecord | None:
        caller = session_caller(session_id)
        raw = self._sessions.get(caller, session_id)
        if raw is None:
            return None
        if _expiry(raw) < time.monotonic():
            self._sessions.pop(caller, session_id)
            return None
        # Records repeat (a policy has few pools, labels and rules): one frozen record per distinct
        # content, rather than a new object on every read.
        body = raw[_HEAD:]
        rec = self._records.get(body)
        if rec is None:
            if len(self._records) >= _RECORDS:
                self._records.clear()
            rec = self._records[body] = _unpack(self._strs, raw)
        return rec

    def expiry(self, session_id: str) -> float | None:
        """Seconds left before the session expires (None: unknown or gone)."""
        raw = self._sessions.get(session_caller(session_id), session_id)
        if raw is None:
            return None
        left = _expiry(raw) - time.monotonic()
        return left if left > 0 else None

    async def put_session(self, session_id: str, record: SessionRecord, ttl: float) -> None:
        self.put_session_now(session_id, record, ttl)

    def put_session_now(self, session_id: str, record: SessionRecord, ttl: float) -> None:
        now = time.monotonic()
        caller = session_caller(session_id)
        sessions = self._sessions
        sessions.put(caller, session_id, _pack(self._strs, record, now + ttl, sessions.bucket(caller)))
        self._puts += 1
        if self._puts & 7 == 0:
            # Sweep as we go: the caller's oldest, if expired, leave now rather than at the cap, so
            # memory follows the live sessions (16 every 8 puts keeps ahead of one new a put).
            for _ in range(16):
                old = sessions.oldest(caller)
                if old is None or _expiry(old[1]) >= now:
                    break
                sessions.pop(caller, old[0])

    async def list_sessions(self, limit: int = 100) -> dict[str, SessionRecord]:
        now = time.monotonic()
        out = {}
        for sid, raw in self._sessions.newest():
            if _expiry(raw) >= now:
                out[sid] = _unpack(self._strs, raw)
                if len(out) >= limit:
                    break
        return out

    # --- stored responses -------------------------------------------------------------------

    async def put_response(self, caller: str, response_id: str, record: bytes, ttl: float) -> None:
        self.put_response_now(caller, response_id, record, ttl)

    def put_response_now(self, caller: str, response_id: str, record: bytes, ttl: float) -> bool:
        if len(record) > self.max_response_bytes:
            log.warning("stored response %s not kept: %d bytes, over the %d-byte cap", response_id[:64],
                        len(record), self.max_response_bytes)
            return False
        now = time.monotonic()
        self._responses.put(caller, response_id, (self._responses.bucket(caller), now + ttl, bytes(record)))
        for _ in range(2):  # expired ones leave as new ones come (as sessions do)
            old = self._responses.oldest(caller)
            if old is None or old[1][1] >= now:
                break
            self._responses.pop(caller, old[0])
        return True

    async def get_response(self, caller: str, response_id: str) -> bytes | None:
        return self.get_response_now(caller, response_id)

    def get_response_now(self, caller: str, response_id: str) -> bytes | None:
        item = self._responses.get(caller, response_id)
        if item is None:
            return None
        if item[1] < time.monotonic():
            self._responses.pop(caller, response_id)
            return None
        return item[2]

    def response_expiry(self, caller: str, response_id: str) -> float | None:
        item = self._responses.get(caller, response_id)
        left = None if item is None else item[1] - time.monotonic()
        return left if left is not None and left > 0 else None

    async def delete_response(self, caller: str, response_id: str) -> bool:
        item = self._responses.pop(caller, response_id)
        return item is not None and item[1] >= time.monotonic()

    def responses_held(self) -> tuple[int, int]:
        """(responses, bytes they weigh) held in memory."""
        return len(self._responses), self._responses.weight

    # --- circuits, drains, windows ----------------------------------------------------------

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
        start, total, _ = self._windows.get(key, (now, 0, window))
        if now - start >= window:
            start, total = now, 0
        total += amount
        self._windows[key] = (start, total, window)
        if len(self._windows) > max(1024, 2 * self._windows_swept):
            # Ended windows go once the table has doubled since the last sweep: O(1) a call on
            # average, and the table holds at most twice the keys counted in one window.
            self._windows = {k: v for k, v in self._windows.items() if now - v[0] < v[2]}
            self._windows_swept = len(self._windows)
        return total

    def windows_held(self) -> int:
        return len(self._windows)

    async def flush(self) -> None:
        return None

    async def sync(self, inflight: dict[str, int], counters: list[CounterDelta],
                   buckets: list[str], loads: dict[str, LoadRecord] | None = None) -> SharedView | None:
        return None  # nothing is shared: local counts are the whole truth

    def healthy(self) -> bool:
        return True

    def describe(self) -> dict:
        return {"kind": self.kind, "healthy": True, "shared": False, **self.held()}

    def held(self) -> dict:
        """What this store holds now, for /health: the bounded long-lived state."""
        n, weight = self.responses_held()
        return {"sessions": self.session_count(), "max_sessions": self._max, "responses": n,
                "responses_bytes": weight, "windows": len(self._windows)}

    async def aclose(self) -> None:
        return None
