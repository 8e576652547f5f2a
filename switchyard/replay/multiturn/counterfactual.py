"""Routers over per-turn outcomes: the solve rate each reaches at each share of turns sent to the
large pool, without re-running a model (see outcomes.py for what a per-turn outcome is).

A router assigns every turn of every session a pool; a session solves iff each of its turns
passes on its pool. Routers: the policy's classifier per turn and per session (threshold swept
over its P(hard)), escalate on a tool error (from that turn on), escalate after N calls in a turn
(from that turn on), random at every share (its expectation, exact), and an oracle that knows
the outcomes (fewest large turns first). An escalated turn counts as large whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from switchyard.replay.multiturn.outcomes import TurnOutcome

Table = dict[str, dict[str, list[TurnOutcome]]]  # case id -> pool -> outcome per turn


@dataclass(slots=True)
class Curve:
    name: str
    points: list[tuple[float, float]] = field(default_factory=list)  # (large share of turns, solve rate %)
    kind: str = "router"  # router | baseline | ceiling | point


def build_table(outcomes: list[TurnOutcome], small: str, large: str) -> tuple[Table, list[str]]:
    """Cases with every turn on both pools (the rest are named in the notes)."""
    raw: dict[str, dict[str, dict[int, TurnOutcome]]] = {}
    for o in outcomes:
        raw.setdefault(o.id, {}).setdefault(o.pool, {})[o.turn] = o  # a later line wins
    table: Table = {}
    incomplete = []
    for cid, pools in raw.items():
        n = next(iter(next(iter(pools.values())).values())).n_turns
        if all(len(pools.get(p, {})) == n for p in (small, large)):
            table[cid] = {p: [pools[p][k] for k in range(n)] for p in (small, large)}
        else:
            incomplete.append(cid)
    return table, incomplete


def evaluate(table: Table, assign: dict[str, list[bool]], small: str, large: str) -> tuple[float, float]:
    turns = sum(len(v) for v in assign.values())
    on_large = sum(sum(v) for v in assign.values())
    solved = sum(all(table[c][large if a else small][k].passed for k, a in enumerate(v)) for c, v in assign.items())
    return (on_large / turns if turns else 0.0), 100.0 * solved / len(assign) if assign else 0.0


def threshold_curve(name: str, table: Table, scores: dict[str, list[float]], small: str, large: str) -> Curve:
    cuts = sorted({s for v in scores.values() for s in v}, reverse=True)
    curve = Curve(name, [evaluate(table, {c: [False] * len(v) for c, v in scores.items()}, small, large)])
    for t in cuts:
        curve.points.append(evaluate(table, {c: [s >= t for s in v] for c, v in scores.items()}, small, large))
    return curve


def sticky(flags: list[bool]) -> list[bool]:
    """Large from the first flagged turn on (escalate_only: a session never comes back down)."""
    out, up = [], False
    for f in flags:
        up = up or f
        out.append(up)
    return out


def escalation_curves(table: Table, small: str, large: str, ns: tuple[int, ...] = (1, 2, 3, 4, 6, 8)) -> list[Curve]:
    err = {c: sticky([o.tool_error for o in v[small]]) for c, v in table.items()}
    curves = [Curve("escalate on a tool error", [evaluate(table, err, small, large)], "point")]
    pts = []
    for n in ns:
        a = {c: sticky([o.calls >= n or o.cut for o in v[small]]) for c, v in table.items()}
        pts.append(evaluate(table, a, small, large))
    curves.append(Curve(f"escalate after N calls in a turn (N={','.join(map(str, ns))})",
                        sorted(pts), "router"))
    return curves


def random_curve(table: Table, small: str, large: str, steps: int = 20) -> Curve:
    curve = Curve("random (same share)", kind="baseline")
    for i in range(steps + 1):
        p = i / steps
        total = 0.0
        for v in table.values():
            prob = 1.0
            for s, lg in zip(v[small], v[large], strict=True):
                prob *= p * lg.passed + (1 - p) * s.passed
            total += prob
        curve.points.append((p, 100.0 * total / len(table) if table else 0.0))
    return curve


def oracle_curve(table: Table, small: str, large: str) -> Curve:
    turns = sum(len(v[small]) for v in table.values())
    costs = []
    for v in table.values():
        need = [not s.passed for s in v[small]]
        if all(s.passed or lg.passed for s, lg in zip(v[small], v[large], strict=True)):
            costs.append(sum(need))
    solved0 = sum(c == 0 for c in costs)
    curve = Curve("oracle (knows the outcomes)", [(0.0, 100.0 * solved0 / len(table) if table else 0.0)], "ceiling")
    used, solved = 0, solved0
    for c in sorted(x for x in costs if x > 0):
        used, solved = used + c, solved + 1
        curve.points.append((used / turns, 100.0 * solved / len(table)))
    return curve


def reach(curve: Curve, target: float) -> float | None:
    """The smallest large share at which the curve reaches `target` (None: never)."""
    got = [share for share, rate in curve.points if rate >= target - 1e-9]
    return min(got) if got else None


def operating_points(curves: list[Curve], large_only: float) -> list[dict[str, Any]]:
    rows = []
    for c in curves:
        rows.append({"router": c.name, "kind": c.kind,
                     "share_at_90": reach(c, 0.9 * large_only), "share_at_95": reach(c, 0.95 * large_only),
                     "points": [{"large_share": round(s, 4), "solve_rate": round(r, 2)} for s, r in c.points]})
    return rows
