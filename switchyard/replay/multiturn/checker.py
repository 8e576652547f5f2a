"""BFCL's multi-turn check, written here: per turn, the environment's state after the model's
calls against the state after the ground truth's, and the ground truth's execution results found
among everything the model's calls returned so far (any order, each used once). A session passes
when every turn does; like BFCL, checking stops at the first failing turn.

The model's calls are run again from the initial state (as BFCL's checker does), in one
environment for the model and one for the ground truth, each kept across turns. A turn whose
ground truth is empty (a question the functions cannot answer yet) is not checked, but its calls
still run so later states are right. A session cut short (step cap, an error) fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from switchyard.replay.multiturn.data import SessionCase
from switchyard.replay.multiturn.env import Call, Environment, parse_call
from switchyard.replay.multiturn.session import SessionRecord


@dataclass(slots=True)
class Verdict:
    valid: bool
    turns: list[bool | None] = field(default_factory=list)  # per turn; None: not reached
    failed_turn: int | None = None
    error_type: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _unordered_contains(model: list[str], expected: list[str]) -> list[str]:
    pool = list(model)
    missing = []
    for item in expected:
        try:
            pool.remove(item)
        except ValueError:
            missing.append(item)
    return missing


def score(case: SessionCase, rec: SessionRecord) -> Verdict:
    """A recorded session's verdict; one the server failed mid-way (an HTTP error) fails."""
    if rec.error:
        turns: list[bool | None] = [None] * len(case.ground_truth)
        cut = max(0, min(len(rec.turns), len(turns)) - 1)
        turns[cut] = False
        return Verdict(False, turns, cut, "session_error", rec.error)
    return check(case, rec.decoded())


def check(case: SessionCase, decoded: list[list[list[Call]]]) -> Verdict:
    """`decoded`: per turn, per step, the model's calls (steps without readable calls left out)."""
    n = len(case.ground_truth)
    turns: list[bool | None] = [None] * n

    def fail(k: int, kind: str, msg: str) -> Verdict:
        turns[k] = False
        return Verdict(False, turns, k, kind, msg)

    if len(decoded) != n:
        # BFCL: force-terminated; the turns that ran are not checked either.
        cut = min(len(decoded), n) - 1 if decoded else 0
        turns[cut] = False
        return Verdict(False, turns, cut, "multi_turn:force_terminated", f"cut short in turn {cut} of {n}")
    model_env = Environment(case.involved_classes, case.initial_config, case.long_context)
    truth_env = Environment(case.involved_classes, case.initial_config, case.long_context)
    all_model_results: list[str] = []
    for k, truth in enumerate(case.ground_truth):
        steps = [s for s in decoded[k] if s]
        for step in steps:
            all_model_results.extend(model_env.execute(step))
        truth_results = truth_env.execute([parse_call(c) for c in truth])
        if not truth:
            turns[k] = True
            continue
        if not steps:
            return fail(k, "multi_turn:empty_turn_model_response", f"no calls in turn {k}")
        model_state, truth_state = model_env.state(), truth_env.state()
        for cls, attrs in truth_state.items():
            diff = [a for a, v in attrs.items() if model_state[cls].get(a) != v]
            if diff:
                return fail(k, "multi_turn:instance_state_mismatch", f"turn {k}: {cls} differs in {diff}")
        missing = _unordered_contains(all_model_results, truth_results)
        if missing:
            return fail(k, "multi_turn:execution_response_mismatch",
                        f"turn {k}: {len(missing)} expected results missing, e.g. {missing[0][:120]!r}")
        turns[k] = True
    return Verdict(True, turns)
