"""The dashboard's percentiles from Prometheus buckets agree with the exact ones, to a bucket."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram

from switchyard.gateway.metrics import LATENCY_BUCKETS
from switchyard.ui.live import _buckets, _diff_buckets, quantile


def _exact(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _bucket_of(v: float) -> tuple[float, float]:
    lo = 0.0
    for le in LATENCY_BUCKETS:
        if v <= le:
            return lo, le
        lo = le
    return lo, float("inf")


def test_quantiles_fall_in_the_true_quantiles_bucket() -> None:
    rng = random.Random(7)
    reg = CollectorRegistry()
    h = Histogram("lat", "latency", ["pool"], buckets=LATENCY_BUCKETS, registry=reg)
    early = [rng.lognormvariate(-4, 1) for _ in range(300)]
    for v in early:
        h.labels("small").observe(v)
    bounds, first = _buckets(h, "pool")
    late = [rng.lognormvariate(-2, 0.5) for _ in range(500)]
    for v in late:
        h.labels("small").observe(v)
    _, second = _buckets(h, "pool")
    assert bounds[-1] == float("inf") and second["small"][-1] == 800
    window = _diff_buckets(second["small"], first["small"])  # only what came after the first sample
    assert window[-1] == 500
    for q in (0.5, 0.9, 0.99):
        got = quantile(q, bounds, window)
        lo, hi = _bucket_of(_exact(late, q))
        assert got is not None and lo <= got <= hi, (q, got, lo, hi)
    assert quantile(0.5, bounds, [0.0] * len(bounds)) is None
