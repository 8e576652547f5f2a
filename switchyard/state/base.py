"""StateStore: what the gateway remembers between requests, behind one small interface.

In-memory for one gateway (state/memory.py); Redis when several gateways share (state/redis.py).
Every method is async and must return quickly: the request path awaits it.
"""

from __future__ import annotations

from dataclasses import dataclass
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


class StateStore(Protocol):
    kind: str

    async def get_session(self, session_id: str) -> SessionRecord | None: ...

    async def put_session(self, session_id: str, record: SessionRecord, ttl: float) -> None: ...

    async def list_sessions(self, limit: int = 100) -> dict[str, SessionRecord]: ...

    async def get_circuit(self, replica: str) -> CircuitRecord | None: ...

    async def put_circuit(self, replica: str, record: CircuitRecord) -> None: ...

    async def incr_window(self, key: str, amount: int, window: float) -> int:
        """Add `amount` to a counter that resets every `window` seconds; return the new total."""
        ...

    def healthy(self) -> bool: ...

    async def aclose(self) -> None: ...
