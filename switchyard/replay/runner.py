"""The three ways to replay: live, dry run, counterfactual (from outcomes); and each policy's
hardness per case, from which compare.py draws its quality curve."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from switchyard.classify.base import Label
from switchyard.classify.features import extract
from switchyard.replay.cases import Case
from switchyard.replay.live import LiveClient
from switchyard.replay.outcomes import OutcomeTable
from switchyard.replay.results import CaseResult, RunResult
from switchyard.replay.router import RoutedCase, Router

OnDone = Callable[[CaseResult], None] | None


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
    r.cached_tokens = o.get("cached_tokens")
    r.served_by = o.get("served_by")
    r.error = o.get("error") or ""
    r.status = o.get("status") or "ok"
    return r


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
    failed = [r for r in results if (r.trace or {}).get("classifier") == "fail-open"]
    if failed:
        run.notes.append(f"the classifier failed open on {len(failed)} of {len(results)} cases (a timeout, an "
                         f"error or its breaker open), labelling them {failed[0].label!r}")
    ms = sorted(r.trace["classifier_ms"] for r in results
                if r.trace and r.trace.get("classifier") in ("onnx", "llm") and r.trace.get("classifier_ms") is not None)
    if ms:
        run.notes.append(f"classifier time per request: p50 {ms[len(ms) // 2]:.2f} ms, max {ms[-1]:.2f} ms")
    return run


ALWAYS_LARGE, NEVER_LARGE = 2.0, -1.0  # hardness of cases the rules decide whatever the label


async def hardness(table: OutcomeTable, router: Router, run: RunResult) -> dict[str, float]:
    """How readily the policy sends each case to the large pool, for the quality curves.

    The label the counterfactual run got for a case (the classifier ran once) gives P(hard);
    the rules, asked with the label forced either way, say whether the label matters at all: a
    case they send to the large pool whatever its label (`tools >= 3`) ranks above every
    classified one, a case they never send there ranks below. Moving the threshold on P(hard)
    then traces the policy's curve from all-small to all-large.
    """
    hard, easy = Label(router.hard, 1.0, "sweep"), Label(router.easy, 1.0, "sweep")
    out: dict[str, float] = {}
    for oc, r in zip(table.cases, run.results, strict=True):
        body = dict(oc.request)
        body["model"] = router.name
        features = extract(body)
        if_hard = (await router.route_labelled(features, body, hard)).pool == router.large
        if_easy = (await router.route_labelled(features, body, easy)).pool == router.large
        p = router.hard_probability(Label(r.label or "", r.confidence or 0.0))
        if if_hard and if_easy:
            out[oc.id] = ALWAYS_LARGE
        elif not if_hard and not if_easy:
            out[oc.id] = NEVER_LARGE
        else:  # the label decides (a policy that sends easy cases large reads the label the other way)
            out[oc.id] = p if if_hard else 1.0 - p
    return out
