"""PNG plot of routed throughput against the large share f (matplotlib, Agg: no display)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from switchyard.cluster.capacity import Capacity, fmt_ratio


def plot_capacity(
    cap: Capacity,
    path: str | Path,
    marks: list[float],
    simulated: list[tuple[float, float]] | None = None,
    unit: str = "req/s",
    title: str = "",
) -> Path:
    """Routed and baseline throughput vs f; `simulated` adds (f, sustained) points from --simulate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = np.linspace(0.01, 1.0, 397)
    routed = np.array([cap.routed(x) for x in f])
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(f, routed, label=f"routed ({cap.large_pool} + {', '.join(cap.small_pools) or 'none'})")
    ax.axhline(cap.baseline_cap, color="grey", linestyle="--",
               label=f"baseline: {cap.baseline_replicas} x {cap.large_pool}")  # fmt: skip
    for m in marks:
        y = cap.routed(m)
        ax.plot([m], [y], "o", color="C3")
        ax.annotate(fmt_ratio(cap.speedup(m)), (m, y), textcoords="offset points", xytext=(6, 6))
    if simulated:
        xs, ys = zip(*simulated, strict=True)
        ax.plot(xs, ys, "x", color="C2", label="simulated (saturation)")
    ax.set_xlabel("share of requests sent to the large pool, f")
    ax.set_ylabel(f"cluster throughput ({unit})")
    ax.set_ylim(0, min(float(routed.max()), cap.baseline_cap * 8) * 1.1)
    ax.set_title(title or "Routed throughput vs large share")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
