"""What a serving gateway holds between requests, for the HTTP edges to read: the Gateway
(policies, pools, routing, dispatch), its metrics, auth, the trace recorder, the state sync, the
request counters the SIGTERM drain waits on, and the recent decisions the dashboard lists.

The proxy, the admin API and the UI all take this one object; none reaches into another.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from switchyard.gateway.auth import Auth
from switchyard.gateway.gateway import Gateway
from switchyard.gateway.metrics import Metrics
from switchyard.gateway.recorder import TraceRecorder
from switchyard.gateway.usage import Usage
from switchyard.policy.rules import RouteDecision
from switchyard.pools.sync import StateSync

if TYPE_CHECKING:  # OpenTelemetry's SDK is imported only when tracing is on (api/app.py)
    from switchyard.gateway.tracing import Tracing

RECENT_KEPT = 200


@dataclass(frozen=True, slots=True)
class RecentDecision:
    """One finished request as the dashboard lists it."""

    at: float  # wall-clock time it finished
    decision: RouteDecision
    pool: str  # the pool that served it (a fallback pool when decision.pool had no room)
    replica: str  # "-" when no replica answered
    status: int
    seconds: float  # whole request, to the last byte
    overhead: float  # what the gateway itself added
    usage: Usage | None = None  # the upstream's usage, when it gave one
    cost: float | None = None  # USD at the pool's price


class Runtime:
    def __init__(self, gateway: Gateway, metrics: Metrics, sync: StateSync, auth: Auth | None = None) -> None:
        self.gateway = gateway
        self.metrics = metrics
        self.sync = sync
        self.auth = auth
        self.recorder: TraceRecorder | None = None
        self.tracer: Tracing | None = None  # OpenTelemetry spans, when on
        self.started = time.time()
        self.active = 0  # requests being served (streams included): the SIGTERM drain waits on it
        self.admitted = 0
        self.draining = False
        self.worker_info: Callable[[], dict[str, Any]] | None = None  # one of `serve --workers N`: its place
        # The request path only appends (bounded, never waits); the dashboard reads.
        self.recent: deque[RecentDecision] = deque(maxlen=RECENT_KEPT)

    def finished(self, decision: RouteDecision, pool: str, replica: str, status: int, seconds: float,
                 overhead: float, usage: Usage | None = None, cost: float | None = None) -> None:
        """A request ended: count it (its tokens and cost too) and keep it for the dashboard."""
        self.metrics.observe(decision.policy, pool, replica, decision.rule, status, seconds, overhead)
        if usage is not None:
            self.metrics.account(decision.policy, pool, usage, cost)
        self.recent.append(RecentDecision(time.time(), decision, pool, replica, status, seconds, overhead,
                                          usage, cost))

    def health(self) -> dict[str, Any]:
        policies = {}
        degraded = False
        store = self.gateway.store
        for lp in self.gateway.policies():
            pools = {}
            for name, pool in lp.pools.items():
                snap = pool.snapshot()
                if snap["healthy"] == 0:
                    degraded = True
                pools[name] = snap
            st = store.status.get(lp.name) if store else None
            policies[lp.name] = {
                "file": str(lp.path),
                "classifier": lp.spec.classifier.kind,
                "pools": pools,
                "last_reload": None if st is None else {"ok": st.ok, "at": st.at, "error": st.error or None},
            }
        state = self.gateway.state
        state_ok = state.healthy()
        described = state.describe()
        if state.shared:
            described["sync"] = self.sync.describe()
        return {
            "status": "draining" if self.draining else ("ok" if not degraded and state_ok else "degraded"),
            "ready": not self.draining,
            "state": described,
            "auth": self.auth.describe() if self.auth is not None else {"enabled": False},
            "tracing": self.tracer.describe() if self.tracer is not None else {"enabled": False},
            "policies": policies,
            **({"worker": self.worker_info()} if self.worker_info is not None else {}),
        }
