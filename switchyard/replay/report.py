"""The replay report: a rich table on the terminal; report.json, report.html and PNGs on disk."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from switchyard.replay.compare import Comparison, pool_label, render_rich
from switchyard.replay.compare import render_html as comparison_html
from switchyard.replay.results import RunResult
from switchyard.replay.summary import summarize


def _fmt(v: Any, suffix: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}{suffix}"
    return f"{v}{suffix}"


def _usd(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.6f}" if abs(v) < 1 else f"{v:.2f}"


def _score_cell(s: dict[str, Any]) -> str:
    if s["score"] is None:  # nothing scored (a dry run): say how much of it goes to the large pool
        return "-" if not s["cases"] else f"{s['large']}/{s['cases']} to large"
    return f"{s['score']:.1f} ({s['correct']}/{s['scored']})"


def _column_names(runs: list[RunResult]) -> list[str]:
    names = [r.name for r in runs]
    return [f"{r.name} [{r.mode}]" if names.count(r.name) > 1 else r.name for r in runs]


def table_rows(summaries: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    rows: list[tuple[str, list[str]]] = []

    def add(label: str, cells: list[str]) -> None:
        rows.append((label, cells))

    add("mode", [s["mode"] for s in summaries])
    add("cases", [str(s["cases"]) for s in summaries])
    add("score /100", ["not scored" if s["score"] is None else _score_cell(s) for s in summaries])
    add("cases to the large pool", [f"{s['large']}/{s['cases']}" for s in summaries])
    tiers = sorted({t for s in summaries for t in s["per_tier"]})
    for t in tiers:
        add(f"  {t}", [_score_cell(s["per_tier"][t]) if t in s["per_tier"] else "-" for s in summaries])
    cats = sorted({c for s in summaries for c in s["per_category"]})
    for c in cats:
        add(f"  {c}", [_score_cell(s["per_category"][c]) if c in s["per_category"] else "-" for s in summaries])
    pools = sorted({p for s in summaries for p in s["pools"]})
    for p in pools:
        served = next((s["pools"][p].get("served_by") for s in summaries if s["pools"].get(p, {}).get("served_by")), None)
        add(f"pool {pool_label(p, served)}", [
            f"{s['pools'][p]['share'] * 100:.1f}% ({s['split'].get(p, 0)})" if p in s["pools"] else "-"
            for s in summaries
        ])
    add("large share", [_fmt(s["large_share"] * 100 if s["large_share"] is not None else None, "%") for s in summaries])
    rules = sorted({r for s in summaries for r in s["rules"]})
    for r in rules:
        add(f"rule {r}", [str(s["rules"].get(r, 0)) for s in summaries])
    for p in pools:
        def lat(s: dict[str, Any], p: str = p) -> str:
            d = s["pools"].get(p)
            if not d or d["latency_p50_ms"] is None:
                return "-"
            return f"{d['latency_p50_ms']:.0f} / {d['latency_p99_ms']:.0f}"

        add(f"{p} latency p50/p99 ms", [lat(s) for s in summaries])
        add(f"{p} tokens in/out", [
            f"{_fmt(s['pools'][p]['prompt_tokens'])} / {_fmt(s['pools'][p]['completion_tokens'])}"
            if p in s["pools"] else "-"
            for s in summaries
        ])
    if any(s.get("cost_usd") is not None for s in summaries):
        add("cost USD", [_usd(s.get("cost_usd")) for s in summaries])
        add("large-only cost USD", [_usd(s.get("large_only_cost_usd")) for s in summaries])
        add("saved vs large-only", [
            "-" if s.get("saved_usd") is None else
            f"{_usd(s['saved_usd'])}" + (f" ({s['saved_pct']:.1f}%)" if s.get("saved_pct") is not None else "")
            for s in summaries
        ])
    if any(s["throughput"] for s in summaries):
        add("throughput vs all-large", [
            f"{s['throughput']['ratio']:.2f}x" if s["throughput"] and s["throughput"].get("ratio") else
            (s["throughput"] or {}).get("note", "-")
            for s in summaries
        ])
    add("errors / retries / skipped", [f"{s['errors']} / {s['retries']} / {s['skipped']}" for s in summaries])
    if any(s["missing"] for s in summaries):
        add("no outcome for chosen pool", [str(s["missing"]) for s in summaries])
    add("run time", [f"{s['wall_s']:.2f}s" for s in summaries])
    return rows


def render_table(runs: list[RunResult], console: Console | None = None,
                 comparison: Comparison | None = None) -> dict[str, Any]:
    console = console or Console()
    summaries = [summarize(r) for r in runs]
    table = Table(title="switchyard replay", show_lines=False)
    table.add_column("", style="bold")
    for name in _column_names(runs):
        table.add_column(name, justify="right")
    for label, cells in table_rows(summaries):
        table.add_row(label, *cells)
    console.print(table)
    for run, s in zip(runs, summaries, strict=True):
        for note in s["notes"]:
            console.print(f"[yellow]note[/yellow] ({run.name}): {note}")
        if s["aborted"]:
            console.print(f"[red]stopped early[/red] ({run.name}): {s['aborted']}")
    if comparison is not None:
        render_rich(comparison, console)
    return {"summaries": summaries}


def report_data(runs: list[RunResult], line_errors: list[Any], comparison: Comparison | None = None) -> dict[str, Any]:
    return {
        "runs": [
            {
                "name": r.name,
                "mode": r.mode,
                "totals": summarize(r),
                "cases": [c.to_dict() for c in r.results],
                "sweep": r.sweep,
            }
            for r in runs
        ],
        "input_errors": [str(e) for e in line_errors],
        "comparison": comparison.to_json() if comparison is not None else None,
    }


def write_report(out_dir: str | Path, runs: list[RunResult], line_errors: list[Any],
                 comparison: Comparison | None = None) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = report_data(runs, line_errors, comparison)
    paths = {"json": out / "report.json"}
    paths["json"].write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    from switchyard.replay.plots import write_plots

    pngs = write_plots(out, runs, [r["totals"] for r in data["runs"]], comparison)
    paths.update(pngs)
    paths["html"] = out / "report.html"
    paths["html"].write_text(render_html(runs, data, pngs, comparison), encoding="utf-8")
    return paths


def render_html(runs: list[RunResult], data: dict[str, Any], pngs: dict[str, Path],
                comparison: Comparison | None = None) -> str:
    summaries = [r["totals"] for r in data["runs"]]
    head = "".join(f"<th>{html.escape(n)}</th>" for n in _column_names(runs))
    body = "".join(
        f"<tr><th>{html.escape(label)}</th>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
        for label, cells in table_rows(summaries)
    )
    imgs = "".join(f'<figure><img src="{p.name}" alt="{k}"><figcaption>{k}</figcaption></figure>' for k, p in pngs.items())
    errors = "".join(f"<li>{html.escape(e)}</li>" for e in data["input_errors"])
    notes = "".join(
        f"<li>{html.escape(s['name'])}: {html.escape(n)}</li>" for s in summaries for n in s["notes"]
    ) + "".join(
        f"<li>{html.escape(s['name'])}: stopped early: {html.escape(s['aborted'])}</li>" for s in summaries if s["aborted"]
    )
    cases = []
    for r in data["runs"]:
        for c in r["cases"]:
            ok = "" if c["correct"] is None else ("yes" if c["correct"] else "no")
            cases.append(
                "<tr>" + "".join(
                    f"<td>{html.escape(str(v))}</td>"
                    for v in (r["name"], c["id"], c["category"], c["pool"] or "-", c["rule"] or "-",
                              c["label"] or "-", ok, c["latency_ms"] if c["latency_ms"] is not None else "-",
                              c["error"])
                ) + "</tr>"
            )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>switchyard replay</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}th{{text-align:left}}
figure{{display:inline-block;margin:1em}}img{{max-width:560px}}</style></head><body>
<h1>switchyard replay</h1>
<table><tr><th></th>{head}</tr>{body}</table>
{comparison_html(comparison) if comparison is not None else ""}
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
{f"<h2>Input errors</h2><ul>{errors}</ul>" if errors else ""}
<h2>Plots</h2>{imgs}
<h2>Cases</h2>
<table><tr><th>run</th><th>id</th><th>category</th><th>pool</th><th>rule</th><th>label</th><th>correct</th>
<th>latency ms</th><th>error</th></tr>{"".join(cases)}</table>
</body></html>
"""
