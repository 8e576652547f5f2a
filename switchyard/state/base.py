"""StateStore: what the gateway remembers between requests, behind one small interface.

In-memory for one gateway (state/memory.py); Redis when several gateways share (state/redis.py).
Every method is async and must return quickly: the request path awaits some of them
(sessions); everything else runs in the background (pools/sync.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SessionRecord:
    policy: str
    pool: str
    label: str = ""
    confidence: float = 0.0
    replica: str | None = None
    rule: str = ""
    turns: int = 0  # user turns seen when the label was decided (classify_on: user_turn)


@dataclass(frozen=True, slots=True)
class CircuitRecord:
    state: str  # closed | open | half_open
    until: float = 0.0  # wall-clock time the open state ends
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LoadRecord:
    """A replica's own load as one gateway read it (strategy least_load), shared with the others."""

    running: float
    waiting: float
    kv: float | None  # KV-cache usage 0..1, None: not published by the engine
    base: int  # in-flight count on the replica (all gateways) when it was read
    age: float  # seconds since it was read (relative: hosts' clocks never compared)


@dataclass(slots=True)
class SharedView:
    """What the other gateways hold, as of one sync (pools/sync.py applies it to the replicas)."""

    inflight: dict[str, int] = field(default_factory=dict)  # replica url -> requests in flight elsewhere
    circuits: dict[str, CircuitRecord] = field(default_factory=dict)  # replica url -> open circuit
    drains: dict[str, str] = field(default_factory=dict)  # replica url -> draining | drained
    counters: dict[str, dict[str, int]] = field(default_factory=dict)  # bucket -> field -> shared total
    loads: dict[str, LoadRecord] = field(default_factory=dict)  # replica url -> its latest load reading
    gateways: int = 1  # live gateways sharing this store, this one included
    rank: int = 0  # this gateway's place among them (0..gateways-1), the same order on every gateway


# Stored OpenAI Responses (`store: true`, read back by `previous_response_id` and GET/DELETE
# /v1/responses/{id}): the defaults of their bounds. A record is the API's own bytes, opaque here.
RESPONSE_TTL = 24 * 3600.0  # seconds a stored response lives (OpenAI keeps them 30 days; a gateway, less)
MAX_RESPONSES_PER_CALLER = 10_000  # beyond it, the caller's own oldest go
MAX_RESPONSE_BYTES = 4 * 1024 * 1024  # a larger record is not stored (logged)
MAX_RESPONSES_MEMORY = 256 * 1024 * 1024  # bytes of records one gateway keeps in memory, all callers


def session_key(policy: str, session_id: str, caller: str = "") -> str:
    """Where a session's state lives: per policy, per caller (API key id) and per session id, so
    one key can never steer another key's session. Policy names and key ids hold no NUL."""
    return f"{policy}\0{caller}\0{session_id}"


def session_caller(key: str) -> str:
    """The caller a session key belongs to ("" for keys not made by session_key): in-memory stores
    bound sessions per caller with it."""
    i = key.find("\0")
    j = key.find("\0", i + 1) if i >= 0 else -1
    return key[i + 1:j] if j >= 0 else ""


# A counter update for sync(): (bucket, field, amount to add, the bucket's expiry in ms). A bucket
# holds the counters of one time window (e.g. every API key's requests in one minute).
CounterDelta = tuple[str, str, int, int]


class StateStore(Protocol):
    kind: str
    shared: bool  # True: other gateways see this state; sync() is worth calling

    async def get_session(self, session_id: str) -> SessionRecord | None: ...

    async def put_session(self, session_id: str, record: SessionRecord, ttl: float) -> None: ...

    async def list_sessions(self, limit: int = 100) -> dict[str, SessionRecord]: ...

    async def put_response(self, caller: str, response_id: str, record: bytes, ttl: float) -> None:
        """Keep a stored response for `ttl` seconds, visible only to `caller`. Never raises: a record
        over the size cap is not kept (logged), a caller over its cap loses its own oldest."""
        ...

    async def get_response(self, caller: str, response_id: str) -> bytes | None:
        """The record `caller` stored under `response_id`; None if unknown, expired, evicted,
        another caller's, or (shared stores) not reachable right now."""
        ...

    async def delete_response(self, caller: str, response_id: str) -> bool:
        """True if `caller` had a response of that id (it is gone now)."""
        ...

    async def get_circuit(self, replica: str) -> CircuitRecord | None: ...

    async def put_circuit(self, replica: str, record: CircuitRecord) -> None: ...

    async def put_drain(self, replica: str, state: str | None) -> None:
        """draining | drained | None (back in service), for every gateway."""
        ...

    async def incr_window(self, key: str, amount: int, window: float) -> int:
        """Add `amount` to a counter that resets every `window` seconds; return the new total."""
        ...

    async def flush(self) -> None:
        """Return when this gateway's writes so far are visible to the other gateways."""
        ...

    async def sync(self, inflight: dict[str, int], counters: list[CounterDelta],
                   buckets: list[str], loads: dict[str, LoadRecord] | None = None) -> SharedView | None:
        """Publish this gateway's in-flight counts (as an expiring lease), counter deltas and new
        load readings; read everyone else's, the totals of every counter in `buckets` and the
        latest load reading of every replica. None when there is nothing shared or the store is
        unreachable."""
        ...

    def healthy(self) -> bool: ...

    def describe(self) -> dict:
        """For /health: kind, whether it answers, and why not."""
        ...

    async def aclose(self) -> None: ...
