"""What one case produced in one run, and the run as a whole."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class CaseResult:
    id: str
    category: str
    tier: str | None = None
    kind: str = "ast"
    pool: str | None = None
    rule: str | None = None
    label: str | None = None
    confidence: float | None = None
    reason: str | None = None
    correct: bool | None = None  # None: not scored (dry run, recorded traffic, error before an answer)
    error: str = ""  # why the answer is wrong, or why there is no answer
    status: str = "ok"  # ok | error | skipped | missing | routed (dry run)
    http_status: int | None = None  # of the answer, when one came
    latency_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # of the prompt tokens (usage.prompt_tokens_details.cached_tokens)
    cost_usd: float | None = None  # at the serving pool's price (the gateway's x-switchyard-cost-usd, if it said)
    large_cost_usd: float | None = None  # the same case on the large pool, at its price (replay/cost.py)
    retries: int = 0
    served_by: str | None = None  # the `model` the answer names (e.g. "reference (upper bound)")
    calls: list[dict[str, Any]] | None = None
    trace: dict[str, Any] | None = None  # how routing decided (dry run, counterfactual): gateway.routing's trace

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class RunResult:
    name: str  # the policy (or pool) this run replayed through
    mode: str  # live | dry-run | counterfactual
    results: list[CaseResult]
    policy_file: str | None = None
    large_pool: str = "large"
    aborted: str | None = None  # why the run stopped early (results so far are kept)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    sweep: list[dict[str, float]] | None = None
    throughput: dict[str, Any] | None = None
