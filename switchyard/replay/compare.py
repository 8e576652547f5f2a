"""Routers side by side on the same saved outcomes: each one's curve and RouteLLM's metrics,
with a random router as the baseline and an oracle as the ceiling of routing.

A router here is a policy (its classifier and rules) replayed counterfactually; its hardness
per case says how readily it sends the case to the large pool (runner.hardness). Only cases
with an outcome of both pools count; the random router's curve is the expected one (exact,
no sampling); the oracle knows the outcomes (first the cases only the large pool gets right).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from switchyard.replay.outcomes import OutcomeTable
from switchyard.replay.quality import RouterQuality, router_quality

RANDOM = "random (baseline)"
ORACLE = "oracle (knows the outcomes)"


def pool_label(pool: str, served_by: str | None) -> str:
    """`large: reference (upper bound)`: the pool and the model behind it, wherever it is named."""
    return f"{pool}: {served_by}" if served_by else pool


@dataclass
class Comparison:
    cases: int
    small_pool: str
    large_pool: str
    small_label: str  # pool: model
    large_label: str
    small_score: float
    large_score: float
    routers: list[RouterQuality]
    curves: dict[str, list[dict[str, Any]]]
    own_points: dict[str, tuple[float, float]]  # each policy as configured: (large share, score)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "small": {"pool": self.small_pool, "label": self.small_label, "score": round(self.small_score, 2)},
            "large": {"pool": self.large_pool, "label": self.large_label, "score": round(self.large_score, 2)},
            "routers": [r.to_json() for r in self.routers],
            "curves": self.curves,
            "own_points": {k: {"large_share": v[0], "score": v[1]} for k, v in self.own_points.items()},
            "notes": self.notes,
        }


def small_pool_of(table: OutcomeTable, large: str) -> str:
    others = [p for p in table.pools if p != large]
    if "small" in others:
        return "small"
    if len(others) != 1:
        raise ValueError(f"cannot tell the small pool among {others}; the outcomes need exactly two pools "
                         f"(the large one is {large!r})")
    return others[0]


def compare(table: OutcomeTable, large: str, routers: list[tuple[str, dict[str, float], tuple[float, float] | None]],
            notes: list[str] | None = None) -> Comparison:
    """`routers`: (name, hardness by case id, its own configured point) per policy."""
    small = small_pool_of(table, large)
    usable = [c for c in table.cases
              if isinstance((c.by_pool.get(small) or {}).get("correct"), bool)
              and isinstance((c.by_pool.get(large) or {}).get("correct"), bool)]
    if not usable:
        raise ValueError(f"no case has outcomes of both pools {small!r} and {large!r}")
    notes = list(notes or [])
    if len(usable) < len(table.cases):
        notes.append(f"{len(table.cases) - len(usable)} cases lack an outcome of {small!r} or {large!r}: "
                     "left out of the comparison")
    s = [bool(c.by_pool[small]["correct"]) for c in usable]
    lg = [bool(c.by_pool[large]["correct"]) for c in usable]
    n = len(usable)
    qualities: list[RouterQuality] = []
    curves: dict[str, list[dict[str, Any]]] = {}
    own: dict[str, tuple[float, float]] = {}
    for name, hard, point in routers:
        q, c = router_quality(name, [hard[cs.id] for cs in usable], s, lg)
        qualities.append(q)
        curves[name] = c.points("router")
        if point is not None:
            own[name] = point
    # Random: one tie group (the expected curve); the oracle: ranked by what the large pool adds.
    q, c = router_quality(RANDOM, [0.0] * n, s, lg, verdict="baseline")
    qualities.append(q)
    curves[RANDOM] = c.points("random")
    q, c = router_quality(ORACLE, [float(b) - float(a) for a, b in zip(s, lg, strict=True)], s, lg, verdict="ceiling")
    qualities.append(q)
    curves[ORACLE] = c.points("oracle")
    return Comparison(
        n, small, large, pool_label(small, table.served_by(small)), pool_label(large, table.served_by(large)),
        100.0 * sum(s) / n, 100.0 * sum(lg) / n, qualities, curves, own, notes,
    )


def _pct(v: float | None) -> str:
    return "never" if v is None else f"{100 * v:.1f}%"


def rows(c: Comparison) -> list[list[str]]:
    """The comparison as table rows, header first (terminal, HTML and README alike)."""
    out = [["router", "APGR (95% CI)", "CPT(50%)", "CPT(80%)", "score at 25% large", "score at 50% large",
            "vs random"]]
    for q in c.routers:
        if q.apgr is None:
            apgr = "-"
        elif q.apgr_ci is None:
            apgr = f"{q.apgr:.3f}"
        else:
            apgr = f"{q.apgr:.3f} [{q.apgr_ci[0]:.3f}, {q.apgr_ci[1]:.3f}]"
        out.append([q.name, apgr, _pct(q.cpt50), _pct(q.cpt80), f"{q.score_25:.1f}", f"{q.score_50:.1f}", q.verdict])
    return out


def heading(c: Comparison) -> str:
    return (f"{c.cases} cases; small only ({c.small_label}) {c.small_score:.1f}/100, "
            f"large only ({c.large_label}) {c.large_score:.1f}/100")


def render_rich(c: Comparison, console: Console) -> None:
    table = Table(title="routing quality (RouteLLM metrics)", caption=heading(c))
    head, *body = rows(c)
    for k, h in enumerate(head):
        table.add_column(h, justify="left" if k in (0, len(head) - 1) else "right", no_wrap=k == 0)
    for r in body:
        table.add_row(*r)
    console.print(table)
    for note in c.notes:
        console.print(f"[yellow]note[/yellow]: {note}")


def render_html(c: Comparison) -> str:
    head, *body = rows(c)
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    tr = "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in r) + "</tr>" for r in body)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in c.notes)
    return (f"<h2>Routing quality (RouteLLM metrics)</h2><p>{html.escape(heading(c))}. APGR: the share of the "
            "gap between small only and large only a router recovers, averaged over large shares 0-100% (random: "
            "0.5); CPT(x): the large share needed to recover x of the gap. A router beats random when the 95% "
            f"bootstrap interval of its APGR lies above 0.5.</p><table><tr>{th}</tr>{tr}</table>"
            + (f"<ul>{notes}</ul>" if notes else ""))
