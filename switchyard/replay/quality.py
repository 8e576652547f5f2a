"""Quality against cost, the way router papers report it (RouteLLM, Ong et al. 2024).

Given, per case, whether the small pool and the large pool answer it rightly, and a router's
hardness score (higher: more deserving of the large pool), the router's curve is the score
reached as the share of cases sent to the large pool goes from 0 to 1, hardest first:

- PGR(f), the performance gap recovered at large share f: (score(f) - small) / (large - small).
- APGR: PGR averaged over the whole share range (the area under PGR(f) for f in [0, 1]).
  A random router recovers the gap linearly: its APGR is 0.5 in expectation.
- CPT(x): the smallest large share at which PGR reaches x (RouteLLM's "call-performance
  threshold"); lower is better. Random needs x itself.

Cases of equal hardness cannot be told apart by the router: at a share that splits them, the
curve takes the expected score of sending a random part of them to the large pool (a straight
line between the shares where the tie starts and ends). The curve is therefore exact and
piecewise linear, and so are APGR and CPT; RouteLLM samples ten thresholds and integrates with
trapezoids, which this equals when its thresholds fall on the curve's corners.

"Beats random" is decided with a bootstrap over cases (the router's scores kept, cases drawn
with replacement): a router beats random when the 95% interval of its APGR lies above 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_ROUNDS = 1000
BOOTSTRAP_SEED = 20  # fixed: the report is reproducible
RANDOM_APGR = 0.5


@dataclass(frozen=True)
class Curve:
    """A router's (large share, score /100) corners, share 0 to 1; linear in between."""

    shares: np.ndarray
    scores: np.ndarray
    thresholds: list[float | None]  # the hardness at each corner (None at share 0)

    def score_at(self, share: float) -> float:
        return float(np.interp(share, self.shares, self.scores))

    def points(self, kind: str) -> list[dict[str, object]]:
        return [{"kind": kind, "large_share": round(float(f), 6), "score": round(float(s), 4), "threshold": t}
                for f, s, t in zip(self.shares, self.scores, self.thresholds, strict=True)]


def curve(hardness: Sequence[float], small: Sequence[bool], large: Sequence[bool]) -> Curve:
    """The exact curve of a router over cases with both pools' outcomes."""
    h = np.asarray(hardness, dtype=np.float64)
    s = np.asarray(small, dtype=np.float64)
    lg = np.asarray(large, dtype=np.float64)
    n = len(h)
    if n == 0 or len(s) != n or len(lg) != n:
        raise ValueError("need the hardness and both pools' outcomes of at least one case")
    order = np.argsort(-h, kind="stable")
    levels, starts = np.unique(-h[order], return_index=True)  # tie groups, hardest first
    gain = (lg - s)[order]
    cum = np.concatenate([[0.0], np.cumsum(gain)])
    ends = np.append(starts[1:], n)
    base = s.sum()
    shares = np.concatenate([[0.0], ends / n])
    scores = 100.0 * np.concatenate([[base], base + cum[ends]]) / n
    return Curve(shares, scores, [None, *(-levels).tolist()])


def random_curve(small: Sequence[bool], large: Sequence[bool]) -> Curve:
    """The expected curve of a random router: one tie group."""
    return curve([0.0] * len(small), small, large)


def oracle_curve(small: Sequence[bool], large: Sequence[bool]) -> Curve:
    """The best any router could do: first the cases only the large pool gets right, last the
    cases only the small pool gets right."""
    gain = [float(lg) - float(s) for s, lg in zip(small, large, strict=True)]
    return curve(gain, small, large)


def apgr(c: Curve) -> float | None:
    """Area under PGR(f) over [0, 1]; None when the large pool is no better than the small one."""
    small, large = c.scores[0], c.scores[-1]
    if large - small <= 1e-12:
        return None
    pgr = (c.scores - small) / (large - small)
    return float(np.sum(np.diff(c.shares) * (pgr[1:] + pgr[:-1]) / 2.0))


def cpt(c: Curve, target: float) -> float | None:
    """The smallest large share at which PGR reaches `target` (0..1); None if never."""
    small, large = c.scores[0], c.scores[-1]
    if large - small <= 1e-12:
        return None
    pgr = (c.scores - small) / (large - small)
    for k in range(len(pgr)):
        if pgr[k] >= target - 1e-12:
            if k == 0:
                return 0.0
            lo, hi = pgr[k - 1], pgr[k]
            t = (target - lo) / (hi - lo) if hi > lo else 1.0
            return float(c.shares[k - 1] + t * (c.shares[k] - c.shares[k - 1]))
    return None


def bootstrap_apgr(hardness: Sequence[float], small: Sequence[bool], large: Sequence[bool],
                   rounds: int = BOOTSTRAP_ROUNDS, seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """The 95% interval of APGR over cases drawn with replacement (rounds where the large pool is
    no better than the small one are left out); None if too few rounds are usable."""
    h = np.asarray(hardness, dtype=np.float64)
    s = np.asarray(small, dtype=bool)
    lg = np.asarray(large, dtype=bool)
    rng = np.random.default_rng(seed)
    n = len(h)
    values = []
    for _ in range(rounds):
        idx = rng.integers(0, n, n)
        a = apgr(curve(h[idx], s[idx], lg[idx]))
        if a is not None:
            values.append(a)
    if len(values) < rounds // 2:
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


@dataclass(frozen=True)
class RouterQuality:
    name: str
    apgr: float | None
    apgr_ci: tuple[float, float] | None
    cpt50: float | None
    cpt80: float | None
    score_25: float
    score_50: float
    verdict: str  # "beats random" | "does not beat random" | "worse than random" | "random" | "oracle"

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "apgr": None if self.apgr is None else round(self.apgr, 4),
            "apgr_ci95": None if self.apgr_ci is None else [round(x, 4) for x in self.apgr_ci],
            "cpt50": None if self.cpt50 is None else round(self.cpt50, 4),
            "cpt80": None if self.cpt80 is None else round(self.cpt80, 4),
            "score_at_25": round(self.score_25, 2),
            "score_at_50": round(self.score_50, 2),
            "verdict": self.verdict,
        }


def judge(ci: tuple[float, float] | None) -> str:
    if ci is None:
        return "not measurable (the large pool is no better than the small one)"
    if ci[0] > RANDOM_APGR:
        return "beats random"
    if ci[1] < RANDOM_APGR:
        return "worse than random"
    return "does not beat random"


def router_quality(name: str, hardness: Sequence[float], small: Sequence[bool], large: Sequence[bool],
                   verdict: str | None = None) -> tuple[RouterQuality, Curve]:
    c = curve(hardness, small, large)
    ci = None if verdict else bootstrap_apgr(hardness, small, large)
    q = RouterQuality(name, apgr(c), ci, cpt(c, 0.5), cpt(c, 0.8), c.score_at(0.25), c.score_at(0.5),
                      verdict or judge(ci))
    return q, c
