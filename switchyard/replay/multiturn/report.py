"""The sessions report: solve rate against the share of turns sent to the large pool, per router,
from per-turn outcomes (`replay bfcl:multi_turn_* --pool P --outcomes F` for both pools), with
the operating points where each router reaches 90% and 95% of large-only's solve rate.
Written as report.json, report.md and report.html (with the plot, also sessions_curve.png)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from switchyard.replay.bfcl import BfclData, default_data
from switchyard.replay.multiturn.counterfactual import (
    Curve,
    build_table,
    escalation_curves,
    evaluate,
    operating_points,
    oracle_curve,
    random_curve,
    threshold_curve,
)
from switchyard.replay.multiturn.data import SessionCase, load_sessions
from switchyard.replay.multiturn.env import Environment
from switchyard.replay.multiturn.outcomes import TurnOutcome, truth_history

LIMITS = ("Per-turn outcomes are teacher-forced: each turn ran from the ground truth's history, and a "
          "routed session solves iff each turn passes on its pool. An escalated turn counts as large whole. "
          "In the plot, markers are a router's operating points; lines only join them.")


def turn_bodies(case: SessionCase, model: str) -> list[dict[str, Any]]:
    """The first request of each turn (ground-truth history), as a router sees it."""
    out = []
    for k in range(len(case.turns)):
        env = Environment(case.involved_classes, case.initial_config, case.long_context)
        messages, _ = truth_history(case, k, env)
        tools, _ = case.tools_at(k)
        out.append({"model": model, "messages": messages + case.turn_messages(k), "tools": tools})
    return out


async def _policy_scores(policy: Path, cases: dict[str, SessionCase], large_pool: str | None) -> tuple[str, dict[str, list[float]]]:
    from switchyard.classify.base import Label
    from switchyard.classify.features import extract
    from switchyard.replay.router import Router
    from switchyard.replay.runner import ALWAYS_LARGE, NEVER_LARGE

    router = Router(policy, large_pool)
    hard, easy = Label(router.hard, 1.0, "sweep"), Label(router.easy, 1.0, "sweep")
    scores: dict[str, list[float]] = {}
    try:
        for cid, case in cases.items():
            row = []
            for body in turn_bodies(case, router.name):
                features = extract(body)
                routed = await router.route(body)
                if_hard = (await router.route_labelled(features, body, hard)).pool == router.large
                if_easy = (await router.route_labelled(features, body, easy)).pool == router.large
                p = router.hard_probability(routed.decision.label)
                row.append(ALWAYS_LARGE if if_hard and if_easy else NEVER_LARGE if not (if_hard or if_easy)
                           else p if if_hard else 1.0 - p)
            scores[cid] = row
    finally:
        await router.aclose()
    return router.name, scores


async def build(outcomes: list[TurnOutcome], policies: list[Path], small: str, large: str,
                large_pool: str | None = None, data: BfclData | None = None, held_out: bool = False) -> dict[str, Any]:
    table, incomplete = build_table(outcomes, small, large)
    if not table:
        raise ValueError(f"no case has outcomes of every turn on both {small!r} and {large!r}")
    data = data or default_data()
    by_cat: dict[str, set[str]] = {}
    for cid in table:
        by_cat.setdefault(cid.rsplit("_", 1)[0], set()).add(cid)
    cases = {c.id: c for cat, ids in by_cat.items() for c in load_sessions(cat, data, ids=ids)}
    notes = [LIMITS] + ([f"{len(incomplete)} cases left out: not every turn on both pools"] if incomplete else [])
    if held_out:
        from switchyard.replay.heldout import HeldOutError, held_out_filter

        try:
            keep, what = held_out_filter(policies, [(c.id, turn_bodies(c, "auto")[0]) for c in cases.values()])
        except HeldOutError as e:
            raise ValueError(str(e)) from None
        table = {c: v for c, v in table.items() if keep(c)}
        cases = {c: v for c, v in cases.items() if keep(c)}
        by_cat = {k: {c for c in v if keep(c)} for k, v in by_cat.items()}
        by_cat = {k: v for k, v in by_cat.items() if v}
        notes.append(f"--held-out: {what}")
        if not table:
            raise ValueError(f"--held-out: no case is left ({what})")
    all_small = {c: [False] * len(v[small]) for c, v in table.items()}
    all_large = {c: [True] * len(v[small]) for c, v in table.items()}
    small_only, large_only = evaluate(table, all_small, small, large)[1], evaluate(table, all_large, small, large)[1]
    curves: list[Curve] = []
    for policy in policies:
        name, scores = await _policy_scores(policy, cases, large_pool)
        curves.append(threshold_curve(f"{name}: classifier per turn", table, scores, small, large))
        per_session = {c: [v[0]] * len(v) for c, v in scores.items()}
        curves.append(threshold_curve(f"{name}: classifier per session", table, per_session, small, large))
    curves += escalation_curves(table, small, large)
    curves += [random_curve(table, small, large), oracle_curve(table, small, large)]
    served = {p: sorted({o.served_by for v in table.values() for o in v[p] if o.served_by}) for p in (small, large)}
    return {
        "sessions": len(table), "turns": sum(len(v[small]) for v in table.values()),
        "categories": {c: len(v) for c, v in sorted(by_cat.items())},
        "small": {"pool": small, "served_by": served[small], "solve_rate": round(small_only, 2)},
        "large": {"pool": large, "served_by": served[large], "solve_rate": round(large_only, 2),
                  "upper_bound": "reference (upper bound)" in served[large]},
        "routers": operating_points(curves, large_only),
        "notes": notes,
    }


def _label(side: dict[str, Any]) -> str:
    return f"{side['pool']}: {', '.join(side['served_by'])}"


def _pct(x: float | None) -> str:
    return "not reached" if x is None else f"{100 * x:.1f}%"


def markdown(rep: dict[str, Any]) -> str:
    lines = ["# Agent sessions: solve rate vs share of turns on the large pool", "",
             f"{rep['sessions']} sessions, {rep['turns']} turns ({', '.join(f'{c}: {n}' for c, n in rep['categories'].items())}).",
             f"Small only ({_label(rep['small'])}): **{rep['small']['solve_rate']}%**; large only "
             f"({_label(rep['large'])}): **{rep['large']['solve_rate']}%**"
             + (" (an upper bound: the ground truth replayed)." if rep["large"]["upper_bound"] else "."), "",
             "| router | large share at 90% of large-only | at 95% | points |", "|---|---|---|---|"]
    for r in rep["routers"]:
        lines.append(f"| {r['router']} | {_pct(r['share_at_90'])} | {_pct(r['share_at_95'])} | {len(r['points'])} |")
    lines += [""] + [f"- {n}" for n in rep["notes"]]
    return "\n".join(lines) + "\n"


def plot(rep: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    for r in rep["routers"]:
        xs = [100 * p["large_share"] for p in r["points"]]
        ys = [p["solve_rate"] for p in r["points"]]
        style: dict[str, Any] = {"baseline": {"linestyle": "--", "color": "grey"},
                                 "ceiling": {"linestyle": ":", "color": "black"}}.get(r["kind"], {})
        if r["kind"] == "point":
            ax.scatter(xs, ys, label=r["router"], marker="x", zorder=3)
        else:
            # Markers are the operating points a router has; lines only join them.
            ax.plot(xs, ys, label=r["router"], marker="o" if len(xs) < 12 else None, markersize=3, **style)
    for side, color in (("small", "tab:red"), ("large", "tab:green")):
        ax.axhline(rep[side]["solve_rate"], color=color, linewidth=0.8, alpha=0.6)
        ax.annotate(f"{side} only ({_label(rep[side])})", (1, rep[side]["solve_rate"]), fontsize=7,
                    va="bottom" if side == "small" else "top")
    ax.set_xlabel("turns sent to the large pool (%)")
    ax.set_ylabel("sessions solved (%)")
    ax.set_title(f"{rep['sessions']} sessions", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(out: Path, rep: dict[str, Any]) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    png = plot(rep, out / "sessions_curve.png")
    md = markdown(rep)
    (out / "report.json").write_text(json.dumps(rep, indent=2), encoding="utf-8")
    (out / "report.md").write_text(md, encoding="utf-8")
    img = base64.b64encode(png.read_bytes()).decode()
    rows = "".join(f"<tr><td>{html.escape(r['router'])}</td><td>{_pct(r['share_at_90'])}</td>"
                   f"<td>{_pct(r['share_at_95'])}</td></tr>" for r in rep["routers"])
    (out / "report.html").write_text(
        "<!doctype html><meta charset=utf-8><title>Agent sessions</title>"
        f"<h1>Agent sessions</h1><p>{html.escape(md.splitlines()[2])}</p><p>{html.escape(md.splitlines()[3])}</p>"
        f"<img alt='solve rate vs large share' src='data:image/png;base64,{img}'>"
        f"<table border=1><tr><th>router</th><th>large share at 90% of large-only</th><th>at 95%</th></tr>{rows}</table>"
        + "".join(f"<p>{html.escape(n)}</p>" for n in rep["notes"]), encoding="utf-8")
    return {"json": out / "report.json", "md": out / "report.md", "html": out / "report.html", "png": png}
