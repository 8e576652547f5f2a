"""PNG plots for report.html (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from switchyard.replay.compare import ORACLE, RANDOM, Comparison
from switchyard.replay.results import RunResult


def _comparison_curves(ax: Any, c: Comparison) -> None:
    """One line per router, random and the oracle dashed, small only and large only as levels."""
    for name, pts in c.curves.items():
        style = {RANDOM: dict(linestyle="--", color="grey"), ORACLE: dict(linestyle=":", color="black")}.get(name, {})
        ax.plot([100 * p["large_share"] for p in pts], [p["score"] for p in pts], label=name, **style)
    ax.axhline(c.small_score, color="tab:red", linewidth=0.8, alpha=0.6)
    ax.axhline(c.large_score, color="tab:green", linewidth=0.8, alpha=0.6)
    ax.annotate(f"small only ({c.small_label})", (1, c.small_score), fontsize=7, va="bottom")
    ax.annotate(f"large only ({c.large_label})", (1, c.large_score), fontsize=7, va="top")


def write_plots(out: Path, runs: list[RunResult], summaries: list[dict[str, Any]],
                comparison: Comparison | None = None) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: dict[str, Path] = {}

    # Quality vs large share: each router's curve (or each run's sweep), each run's own point marked.
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    if comparison is not None:
        _comparison_curves(ax, comparison)
    else:
        random_drawn = False
        for run in runs:
            pts = sorted((p for p in (run.sweep or []) if p["kind"] == "router"), key=lambda p: p["large_share"])
            if len(pts) > 1:
                ax.plot([100 * p["large_share"] for p in pts], [p["score"] for p in pts], "-",
                        label=f"{run.name}: threshold sweep")
            rnd = [p for p in (run.sweep or []) if p["kind"] == "random"]
            if rnd and not random_drawn:  # the same for every policy: drawn once
                ax.plot([100 * p["large_share"] for p in rnd], [p["score"] for p in rnd], "--", color="grey",
                        label="random split (no classifier)")
                random_drawn = True
    for s in summaries:
        if s["large_share"] is not None and s["score"] is not None:
            ax.plot(100 * s["large_share"], s["score"], "*", markersize=12, label=f"{s['name']} as configured")
    ax.set_xlabel("share sent to the large pool (%)")
    ax.set_ylabel("score /100")
    ax.set_xlim(-2, 102)
    ax.set_title("quality vs large share")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6.5, loc="lower right")
    paths["quality vs large share"] = out / "quality_vs_large_share.png"
    fig.tight_layout()
    fig.savefig(paths["quality vs large share"], dpi=110)
    plt.close(fig)

    # The split: one stacked bar per run.
    pools = sorted({p for s in summaries for p in s["split"]})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [s["name"] + ("" if len(runs) < 2 else f"\n{s['mode']}") for s in summaries]
    bottom = [0.0] * len(summaries)
    for p in pools:
        shares = [100 * s["pools"][p]["share"] if p in s["pools"] else 0.0 for s in summaries]
        ax.bar(names, shares, bottom=bottom, label=p)
        bottom = [b + v for b, v in zip(bottom, shares, strict=True)]
    ax.set_ylabel("% of cases")
    ax.set_title("routing split")
    if pools:
        ax.legend(fontsize=8)
    paths["routing split"] = out / "split.png"
    fig.tight_layout()
    fig.savefig(paths["routing split"], dpi=100)
    plt.close(fig)

    # Latency per pool: a box per (run, pool) with answers.
    data, labels = [], []
    for run in runs:
        by_pool: dict[str, list[float]] = {}
        for r in run.results:
            if r.pool and r.latency_ms is not None and r.status == "ok":
                by_pool.setdefault(r.pool, []).append(r.latency_ms)
        for p, lat in sorted(by_pool.items()):
            data.append(lat)
            labels.append(p if len(runs) < 2 else f"{run.name}\n{p}")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if data:
        ax.boxplot(data, showfliers=True)
        ax.set_xticks(range(1, len(labels) + 1), labels)
    else:
        ax.text(0.5, 0.5, "no latencies (dry run)", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("latency (ms)")
    ax.set_title("latency per pool")
    paths["latency per pool"] = out / "latency.png"
    fig.tight_layout()
    fig.savefig(paths["latency per pool"], dpi=100)
    plt.close(fig)
    return paths
