"""Per-turn outcomes of a pool, for the counterfactual sessions report (no model re-runs).

Each turn k of a case is run on its own from the ground truth's history: the conversation and the
environment as the ground truth leaves them after turns 0..k-1 (its calls, their results, a short
"Done."), then the pool's turn as in a live session. The turn passes BFCL's check for turn k
from that start (state and results against the ground truth's turn k). A routed session then
solves iff every turn passes on the pool it was sent to: exact for any history that kept to the
ground truth, which is what a session that passes its earlier turns has in state (its messages
may differ: these are teacher-forced outcomes, and the report says so).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from switchyard.replay.multiturn.data import SessionCase
from switchyard.replay.multiturn.env import Call, Environment, parse_call
from switchyard.replay.multiturn.reference import TURN_DONE
from switchyard.replay.multiturn.session import SessionClient, Turn


def truth_history(case: SessionCase, k: int, env: Environment) -> tuple[list[dict[str, Any]], list[str]]:
    """The conversation before turn k as the ground truth has it (its calls run in `env`), and
    every result those calls returned."""
    messages: list[dict[str, Any]] = []
    results: list[str] = []
    for j in range(k):
        messages.extend(case.turn_messages(j))
        calls = [parse_call(c) for c in case.ground_truth[j]]
        if calls:
            ids = [f"call_gt_{j}_{i}" for i in range(len(calls))]
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": i, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(env.named_args(c), ensure_ascii=False)}}
                for i, c in zip(ids, calls, strict=True)]})
            got = env.execute(calls)
            results.extend(got)
            messages.extend({"role": "tool", "content": r, "tool_call_id": i} for i, r in zip(ids, got, strict=True))
        messages.append({"role": "assistant", "content": TURN_DONE})
    return messages, results


def check_turn(case: SessionCase, k: int, steps: list[list[Call]], cut: bool) -> tuple[bool, str | None]:
    """BFCL's turn-k check from the ground truth's state after turns 0..k-1."""
    model_env = Environment(case.involved_classes, case.initial_config, case.long_context)
    truth_env = Environment(case.involved_classes, case.initial_config, case.long_context)
    _, prior = truth_history(case, k, model_env)
    truth_history(case, k, truth_env)
    model_results = list(prior)
    for step in steps:
        model_results.extend(model_env.execute(step))
    truth_results = truth_env.execute([parse_call(c) for c in case.ground_truth[k]])
    if cut and k < len(case.ground_truth) - 1:
        return False, "multi_turn:force_terminated"
    if not case.ground_truth[k]:
        return True, None
    if not steps:
        return False, "multi_turn:empty_turn_model_response"
    ms, ts = model_env.state(), truth_env.state()
    if any(ms[c].get(a) != v for c, attrs in ts.items() for a, v in attrs.items()):
        return False, "multi_turn:instance_state_mismatch"
    pool = list(model_results)
    for item in truth_results:
        if item in pool:
            pool.remove(item)
        else:
            return False, "multi_turn:execution_response_mismatch"
    return True, None


def is_tool_error(result: str) -> bool:
    return result.startswith("Error during execution") or result.startswith('{"error"')


@dataclass(slots=True)
class TurnOutcome:
    id: str
    category: str
    turn: int
    n_turns: int
    pool: str
    served_by: str | None
    passed: bool
    error_type: str | None
    requests: int
    calls: int
    tool_error: bool
    cut: bool
    latency_ms: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def outcome_of(case: SessionCase, k: int, pool: str, turn: Turn, cut: bool, error: str | None) -> TurnOutcome:
    steps = [[Call.of(n, a) for c in s.calls for n, a in c.items()] for s in turn.steps if s.calls]
    passed, kind = (False, "session_error") if error else check_turn(case, k, steps, cut)
    return TurnOutcome(
        case.id, case.category, k, len(case.turns), pool,
        next((s.served_by for s in turn.steps if s.served_by), None), passed, kind, len(turn.steps),
        sum(len(s) for s in steps), any(is_tool_error(r) for s in turn.steps for r in s.results), cut,
        round(sum(s.latency_ms for s in turn.steps), 2))


async def collect(cases: list[SessionCase], client: SessionClient, pool: str, concurrency: int = 2,
                  out: Path | None = None) -> list[TurnOutcome]:
    """Every turn of every case on `pool` (the client's model), from the ground truth's history."""
    tag = uuid.uuid4().hex[:8]
    sem = asyncio.Semaphore(max(1, concurrency))
    timeout = httpx.Timeout(client.timeout, connect=min(5.0, client.timeout))
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as http:

        async def one(case: SessionCase, k: int) -> TurnOutcome:
            env = Environment(case.involved_classes, case.initial_config, case.long_context)
            messages, _ = truth_history(case, k, env)
            async with sem:  # each turn its own session: nothing pins it to another turn's pool
                turn, cut, error = await client.run_turn(http, case, k, env, messages, f"{tag}-t{k}/{case.id}")
            return await asyncio.to_thread(outcome_of, case, k, pool, turn, cut, error)

        got = list(await asyncio.gather(*(one(c, k) for c in cases for k in range(len(c.turns)))))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8") as f:
            for o in got:
                f.write(json.dumps(o.to_json(), ensure_ascii=False) + "\n")
    return got


def load_turn_outcomes(paths: list[Path]) -> list[TurnOutcome]:
    out = []
    for p in paths:
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(TurnOutcome(**json.loads(line)))
    return out


def is_turn_outcomes(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as f:
            first = json.loads(f.readline() or "{}")
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and "turn" in first and "n_turns" in first
