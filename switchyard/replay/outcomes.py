"""Outcomes files: per case and pool, whether the pool's model got it right, and at what cost.

One JSON line per case and pool:
    {"id", "category", "pool", "correct", "latency_ms", "prompt_tokens", "completion_tokens",
     "served_by", "request": {...the OpenAI body...}, "tier", "kind", "error", "status"}
A case the pool refused (HTTP 400, 413, 422: e.g. a prompt past its context) is recorded as a
failure with `status` "error"; one it never answered (5xx, timeouts, unreachable) is left out.
`served_by` is the `model` the answer named: which model stood behind the pool (the reference
pool answers as "reference (upper bound)", and reports carry that label wherever the pool appears).
A name ending in `.gz` is read through gzip.
`--outcomes FILE` appends (so a `--pool small` run and a `--pool large` run can share one
file); when a (case, pool) pair appears twice, the later line wins. The classifier work
trains "the small model will fail" from these files; `--from-outcomes` scores any policy
from them without calling a model.
"""

from __future__ import annotations

import gzip
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from switchyard.classify.outcomes import read_bytes
from switchyard.replay.cases import Case, LineError, TraceError
from switchyard.replay.results import CaseResult

REQUIRED = ("id", "pool", "correct", "request")


def outcome_line(case: Case, result: CaseResult, model: str) -> dict[str, Any]:
    return {
        "id": case.id,
        "category": case.category,
        "pool": result.pool,
        "correct": result.correct,
        "latency_ms": result.latency_ms,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cached_tokens": result.cached_tokens,
        "served_by": result.served_by,
        "request": case.request(model),
        "tier": case.tier,
        "kind": case.kind,
        "status": result.status,
        "error": result.error,
        "http_status": result.http_status,
        "rule": result.rule,
        "label": result.label,
        "confidence": result.confidence,
    }


REFUSALS = (400, 413, 422)


def refused(result: CaseResult) -> bool:
    """The pool answered with a refusal of this very request (400, 413, 422: a prompt longer
    than its context, a schema it cannot take): the pool fails the case, as it would fail a
    client sending it. Not 401/403/404 (a key or a name wrong for every request) nor 408/429."""
    return result.http_status in REFUSALS


def append_outcomes(path: str | Path, cases: list[Case], results: list[CaseResult], model: str) -> int:
    """Append the outcome of every scored case the pool answered, refusals included (`refused`).
    Cases without an answer (the gateway unreachable, a 5xx, a timeout, 408, 429) are left out,
    so that an outage is never read as "this pool answers wrong"; unscored cases (`correct`
    null) are left out too."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    by_id = {c.id: c for c in cases}
    n = 0
    with p.open("ab") as f:
        for r in results:
            if (r.status != "ok" and not refused(r)) or r.pool is None or r.correct is None:
                continue
            f.write(orjson.dumps(outcome_line(by_id[r.id], r, model)) + b"\n")
            n += 1
    return n


@dataclass(slots=True)
class OutcomeCase:
    id: str
    category: str
    tier: str | None
    kind: str
    request: dict[str, Any]
    session_id: str | None
    by_pool: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class OutcomeTable:
    cases: list[OutcomeCase]
    errors: list[LineError]

    def served_by(self, pool: str) -> str | None:
        """The model that answered for `pool` (the most frequent `served_by` of its outcomes)."""
        names = Counter(c.by_pool[pool].get("served_by") for c in self.cases if pool in c.by_pool)
        names.pop(None, None)
        return names.most_common(1)[0][0] if names else None

    @property
    def pools(self) -> list[str]:
        seen: dict[str, None] = {}
        for c in self.cases:
            for p in c.by_pool:
                seen.setdefault(p, None)
        return list(seen)


def load_outcomes(paths: list[str | Path]) -> OutcomeTable:
    by_id: dict[str, OutcomeCase] = {}
    errors: list[LineError] = []
    for path in paths:
        p = Path(path)
        try:
            data = read_bytes(p)
        except FileNotFoundError:
            raise TraceError(f"{p}: no such outcomes file") from None
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise TraceError(f"{p}: cannot read: {e}") from None
        for n, line in enumerate(data.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                o = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                errors.append(LineError(str(p), n, f"not valid JSON: {e}"))
                continue
            if not isinstance(o, dict) or any(k not in o for k in REQUIRED):
                errors.append(LineError(str(p), n, f"an outcome needs the keys {', '.join(REQUIRED)}"))
                continue
            if not isinstance(o["request"], dict) or not isinstance(o["pool"], str):
                errors.append(LineError(str(p), n, "`request` must be an object and `pool` a name"))
                continue
            cid = str(o["id"])
            oc = by_id.get(cid)
            if oc is None:
                req = o["request"]
                session = req.get("user") if isinstance(req.get("user"), str) else None
                oc = by_id[cid] = OutcomeCase(
                    cid, str(o.get("category") or "trace"), o.get("tier"), str(o.get("kind") or "ast"),
                    req, o.get("session_id") or session,
                )
            oc.by_pool[o["pool"]] = o
    return OutcomeTable(list(by_id.values()), errors)
