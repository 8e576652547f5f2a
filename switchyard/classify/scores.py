"""How well a probability ranks and how honest it is: ROC AUC, Brier score, reliability table.

For a router the probability matters twice: its order decides which requests go to the large
pool at a given share (ROC AUC measures that order), and its value is what a policy's
`confidence` threshold reads (calibration: does P = 0.7 mean "wrong 7 times in 10"?).
scikit-learn computes them (the `train` extra).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

RELIABILITY_BINS = 10


@dataclass(frozen=True)
class Bin:
    lo: float
    hi: float
    n: int
    mean_p: float  # mean predicted probability in the bin
    observed: float  # share of positives in the bin


@dataclass(frozen=True)
class ProbabilityScores:
    n: int
    positives: int
    roc_auc: float | None  # None when the cases hold one class only
    brier: float
    brier_base_rate: float  # Brier of always predicting the base rate: the bar to beat
    bins: list[Bin]

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "positives": self.positives,
            "roc_auc": None if self.roc_auc is None else round(self.roc_auc, 4),
            "brier": round(self.brier, 4),
            "brier_base_rate": round(self.brier_base_rate, 4),
            "reliability": [
                {"bin": f"{b.lo:.1f}-{b.hi:.1f}", "n": b.n, "mean_p": round(b.mean_p, 4), "observed": round(b.observed, 4)}
                for b in self.bins
            ],
        }


def score_probabilities(y_true: np.ndarray, p: np.ndarray, bins: int = RELIABILITY_BINS) -> ProbabilityScores:
    """`y_true` 1 for the positive class (the small pool fails / complex), `p` its predicted probability."""
    from sklearn.metrics import brier_score_loss, roc_auc_score

    y = np.asarray(y_true, dtype=int)
    p = np.asarray(p, dtype=np.float64)
    if len(y) == 0:
        raise ValueError("no cases to score")
    auc = float(roc_auc_score(y, p)) if len(set(y.tolist())) == 2 else None
    base = float(y.mean())
    edges = np.linspace(0.0, 1.0, bins + 1)
    # Bin k holds edges[k] <= p < edges[k+1]; p == 1 falls in the last bin.
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, bins - 1)
    table = []
    for k in range(bins):
        m = which == k
        if m.any():
            table.append(Bin(float(edges[k]), float(edges[k + 1]), int(m.sum()), float(p[m].mean()), float(y[m].mean())))
    return ProbabilityScores(
        n=len(y), positives=int(y.sum()), roc_auc=auc, brier=float(brier_score_loss(y, p)),
        brier_base_rate=float(((base - y) ** 2).mean()), bins=table,
    )


def reliability_rows(scores: ProbabilityScores) -> list[list[str]]:
    """The reliability table as rows (header first), for the card and the CLI."""
    rows = [["predicted P", "cases", "mean predicted", "observed"]]
    rows += [[f"{b.lo:.1f}-{b.hi:.1f}", str(b.n), f"{b.mean_p:.3f}", f"{b.observed:.3f}"] for b in scores.bins]
    return rows
