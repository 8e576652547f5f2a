"""Totals of a run: score overall and per category, the split, latency and tokens per pool."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from switchyard.replay.results import RunResult


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def _tokens(rows: list[Any], key: str) -> int | None:
    vals = [getattr(r, key) for r in rows if getattr(r, key) is not None]
    return sum(vals) if vals else None


def _cost(rows: list[Any], key: str) -> float | None:
    vals = [getattr(r, key) for r in rows if getattr(r, key) is not None]
    return sum(vals) if vals else None


def _savings(rows: list[Any]) -> dict[str, Any]:
    """The run's cost, what the same cases cost on the large pool, and the difference (replay/cost.py);
    savings over the cases priced both ways."""
    both = [r for r in rows if r.cost_usd is not None and r.large_cost_usd is not None]
    spent = sum(r.cost_usd for r in both)
    large = sum(r.large_cost_usd for r in both)
    return {
        "cost_usd": _cost(rows, "cost_usd"),
        "large_only_cost_usd": large if both else None,
        "saved_usd": large - spent if both else None,
        "saved_pct": round(100.0 * (large - spent) / large, 2) if both and large > 0 else None,
    }


def _score(rows: list[Any], large: str | None = None) -> dict[str, Any]:
    scored = [r for r in rows if r.correct is not None]
    correct = sum(1 for r in scored if r.correct)
    return {
        "cases": len(rows),
        "large": sum(1 for r in rows if large is not None and r.pool == large),
        "scored": len(scored),
        "correct": correct,
        "score": round(100.0 * correct / len(scored), 2) if scored else None,
    }


def summarize(run: RunResult) -> dict[str, Any]:
    rs = run.results
    routed = [r for r in rs if r.pool is not None and r.status not in ("skipped",)]
    n_routed = len(routed) or 1
    split = Counter(r.pool for r in routed)
    rules = Counter(r.rule or "(none)" for r in routed)
    per_category: dict[str, list[Any]] = defaultdict(list)
    per_tier: dict[str, list[Any]] = defaultdict(list)
    per_pool: dict[str, list[Any]] = defaultdict(list)
    for r in rs:
        per_category[r.category].append(r)
        if r.tier:
            per_tier[r.tier].append(r)
        if r.pool is not None:
            per_pool[r.pool].append(r)
    pools: dict[str, Any] = {}
    for pool, rows in sorted(per_pool.items()):
        lat = [r.latency_ms for r in rows if r.latency_ms is not None and r.status == "ok"]
        pools[pool] = {
            **_score(rows),
            "share": round(split.get(pool, 0) / n_routed, 4),
            "latency_p50_ms": percentile(lat, 50),
            "latency_p99_ms": percentile(lat, 99),
            "served_by": Counter(r.served_by for r in rows if r.served_by).most_common(1)[0][0]
            if any(r.served_by for r in rows) else None,
            "prompt_tokens": _tokens(rows, "prompt_tokens"),
            "completion_tokens": _tokens(rows, "completion_tokens"),
            "cost_usd": _cost(rows, "cost_usd"),
        }
    return {
        "name": run.name,
        "mode": run.mode,
        "policy_file": run.policy_file,
        **_score(rs, run.large_pool),
        "large_pool": run.large_pool,
        "large_share": round(split.get(run.large_pool, 0) / n_routed, 4) if routed else None,
        "split": dict(split),
        "rules": dict(rules),
        "per_category": {c: _score(rows, run.large_pool) for c, rows in sorted(per_category.items())},
        "per_tier": {t: _score(rows, run.large_pool) for t, rows in sorted(per_tier.items())},
        "pools": pools,
        "errors": sum(r.status == "error" for r in rs),
        "skipped": sum(r.status == "skipped" for r in rs),
        "missing": sum(r.status == "missing" for r in rs),
        "retries": sum(r.retries for r in rs),
        "wall_s": round(run.wall_s, 3),
        "aborted": run.aborted,
        "notes": run.notes,
        "throughput": run.throughput,
        **_savings(rs),
    }
