"""The three ways to replay: live, dry run, counterfactual (from outcomes); and the sweep."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from switchyard.classify.base import Label
from switchyard.replay.cases import Case
from switchyard.replay.live import LiveClient
from switchyard.replay.outcomes import OutcomeTable
from switchyard.replay.results import CaseResult, RunResult
from switchyard.replay.router import RoutedCase, Router

OnDone = Callable[[CaseResult], None] | None
SWEEP_THRESHOLDS = [round(i / 20, 2) for i in range(21)] + [1.01]


async def run_live(
    cases: list[Case],
    client: LiveClient,
    model: str,
    name: str,
    forced_pool: str | None = None,
    on_done: OnDone = None,
    policy_file: str | None = None,
    large_pool: str = "large",
) -> RunResult:
    t0 = time.perf_counter()
    results = await client.run(cases, model, forced_pool, on_done)
    run = RunResult(name, "live", results, policy_file, large_pool, wall_s=time.perf_counter() - t0)
    done = sum(r.status == "ok" for r in results)
    if client.unreachable:
        run.aborted = f"gateway unreachable ({client.unreachable}); {done} of {len(cases)} cases answered"
    elif client.interrupted:
        run.aborted = f"{client.interrupted}; {done} of {len(cases)} cases answered"
    return run


def _routed(case: Any, rc: RoutedCase, status: str = "ok") -> CaseResult:
    d = rc.decision
    return CaseResult(
        case.id, case.category, case.tier, case.kind, pool=d.pool, rule=d.rule,
        label=d.label.name or None, confidence=d.label.confidence if d.label.name else None,
        reason=d.reason, status=status, trace=rc.routed.trace(),
    )


async def run_dry(cases: list[Case], router: Router, on_done: OnDone = None) -> RunResult:
    t0 = time.perf_counter()
    results = []
    for case in cases:
        r = _routed(case, await router.route(case.request(router.name), case.session_id), "routed")
        results.append(r)
        if on_done:
            on_done(r)
    return RunResult(router.name, "dry-run", results, str(router.policy_file), router.large,
                     wall_s=time.perf_counter() - t0)


def _from_outcome(oc: Any, pool: str, r: CaseResult) -> CaseResult:
    o = oc.by_pool.get(pool)
    if o is None:
        r.status, r.error = "missing", f"no outcome for pool {pool!r}"
        return r
    r.correct = o.get("correct")
    r.latency_ms = o.get("latency_ms")
    r.prompt_tokens = o.get("prompt_tokens")
    r.completion_tokens = o.get("completion_tokens")
    r.error = o.get("error") or ""
    r.status = o.get("status") or "ok"
    return r


async def _labels(table: OutcomeTable, router: Router) -> list[tuple[RoutedCase, dict[str, Any], Label]]:
    out = []
    for oc in table.cases:
        body = dict(oc.request)
        body["model"] = router.name  # as if sent to the policy, not to the pool it was run on
        routed = await router.route(body, oc.session_id)
        out.append((routed, body, routed.decision.label))
    return out


async def run_counterfactual(table: OutcomeTable, router: Router, on_done: OnDone = None) -> RunResult:
    """Each case routed by the policy, its result taken from that pool's saved outcome."""
    t0 = time.perf_counter()
    results = []
    for oc in table.cases:
        body = dict(oc.request)
        body["model"] = router.name
        routed = await router.route(body, oc.session_id)
        r = _routed(oc, routed)
        results.append(_from_outcome(oc, routed.decision.pool, r))
        if on_done:
            on_done(r)
    run = RunResult(router.name, "counterfactual", results, str(router.policy_file), router.large,
                    wall_s=time.perf_counter() - t0)
    missing = sum(r.status == "missing" for r in results)
    if missing:
        run.notes.append(f"{missing} cases have no outcome for the pool the policy chose: left out of the score")
    return run


def _point(results: list[tuple[bool | None, str]], large: str, threshold: float, kind: str) -> dict[str, float]:
    scored = [(c, p) for c, p in results if c is not None]
    n = len(results) or 1
    return {
        "threshold": threshold,
        "large_share": sum(p == large for _, p in results) / n,
        "score": 100.0 * sum(bool(c) for c, _ in scored) / (len(scored) or 1),
        "kind": kind,  # type: ignore[dict-item]
    }


async def sweep(table: OutcomeTable, router: Router, thresholds: list[float] | None = None) -> list[dict[str, Any]]:
    """Quality vs large-share as the classifier's threshold moves, from saved outcomes.

    The classifier runs once per case; each threshold relabels the case (hard if the
    classifier's hard probability >= threshold) and the policy's rules route it. A second
    curve, `random`, sends a deterministic hash-chosen share to the large pool: what the
    same share buys without a classifier.
    """
    thresholds = thresholds or SWEEP_THRESHOLDS
    labelled = await _labels(table, router)
    points: list[dict[str, Any]] = []
    for t in thresholds:
        rows = []
        for oc, (routed, body, label) in zip(table.cases, labelled, strict=True):
            lab = router.relabel(router.hard_probability(label), t)
            pool = (await router.route_labelled(routed.features, body, lab)).pool
            o = oc.by_pool.get(pool)
            rows.append((o.get("correct") if o else None, pool))
        points.append(_point(rows, router.large, t, "classifier"))
    pools = table.pools
    small = next((p for p in pools if p != router.large), None)
    if small is not None and router.large in pools:
        ranks = {oc.id: int(hashlib.blake2b(oc.id.encode(), digest_size=4).hexdigest(), 16) / 2**32 for oc in table.cases}
        for i in range(11):
            f = i / 10
            rows = []
            for oc in table.cases:
                pool = router.large if ranks[oc.id] < f else small
                o = oc.by_pool.get(pool)
                rows.append((o.get("correct") if o else None, pool))
            points.append(_point(rows, router.large, f, "random"))
    return points
