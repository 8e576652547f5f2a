"""What the dashboard shows, read from the gateway's own state and metrics.

A background task samples the Prometheus counters and histograms once a second into a
bounded history (no request-path cost: it reads what the request path already counts);
rates and splits are differences between samples. Per-replica latency percentiles come
from the runtime's ring buffer of recent decisions (the histograms are per pool only).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from switchyard.gateway.runtime import RecentDecision, Runtime
from switchyard.policy.schema import PolicySpec, baseline_pool

HISTORY_S = 300  # seconds of samples kept: the charts' span
RATE_S = 5.0  # requests/s are averaged over this many seconds
RECENT_SHOWN = 50


@dataclass
class Sample:
    t: float
    pools: dict[str, float] = field(default_factory=dict)  # "policy/pool" -> requests so far
    rules: dict[str, float] = field(default_factory=dict)  # "policy/rule"
    replicas: dict[str, float] = field(default_factory=dict)  # "policy/pool/replica"
    errors: dict[str, float] = field(default_factory=dict)  # "policy/pool" -> answers >= 500
    latency: dict[str, list[float]] = field(default_factory=dict)  # pool -> cumulative bucket counts
    classifier: dict[str, list[float]] = field(default_factory=dict)  # kind -> cumulative bucket counts
    fail_open: dict[str, float] = field(default_factory=dict)  # policy -> count
    rejected: float = 0.0
    tokens: dict[str, dict[str, float]] = field(default_factory=dict)  # "policy/pool" -> kind -> tokens
    cost: dict[str, float] = field(default_factory=dict)  # "policy/pool" -> USD


def _counter_totals(metric: Any) -> Iterable[tuple[dict[str, str], float]]:
    for fam in metric.collect():
        for s in fam.samples:
            if s.name.endswith("_total"):
                yield s.labels, s.value


def _buckets(metric: Any, label: str) -> tuple[list[float], dict[str, list[float]]]:
    """Histogram -> (upper bounds, {label value: cumulative counts per bound})."""
    pairs: dict[str, list[tuple[float, float]]] = {}
    for fam in metric.collect():
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                pairs.setdefault(s.labels[label], []).append((float(s.labels["le"]), s.value))
    bounds: list[float] = []
    out: dict[str, list[float]] = {}
    for key, ps in pairs.items():
        ps.sort()
        bounds = [le for le, _ in ps]
        out[key] = [c for _, c in ps]
    return bounds, out


def quantile(q: float, bounds: list[float], counts: list[float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts (linear within a bucket)."""
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in zip(bounds, counts, strict=False):
        if c >= rank:
            if le == float("inf"):
                return prev_le
            span = c - prev_c
            return prev_le + (le - prev_le) * ((rank - prev_c) / span if span > 0 else 1.0)
        prev_le, prev_c = le, c
    return prev_le


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _diff(new: dict[str, float], old: dict[str, float]) -> dict[str, float]:
    return {k: v - old.get(k, 0.0) for k, v in new.items() if v - old.get(k, 0.0) > 0}


def _diff_buckets(new: list[float], old: list[float] | None) -> list[float]:
    if not old:
        return new
    return [a - b for a, b in zip(new, old, strict=False)]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


class LiveSampler:
    def __init__(self, rt: Runtime):
        self.rt = rt
        self.samples: deque[Sample] = deque(maxlen=HISTORY_S + 1)
        # Requests/s per pool and per rule between consecutive samples, computed once when sampled.
        self.steps: deque[tuple[float, dict[str, float], dict[str, float]]] = deque(maxlen=HISTORY_S)
        self.lat_bounds: list[float] = []
        self.clf_bounds: list[float] = []
        self._task: asyncio.Task | None = None

    # --- sampling -----------------------------------------------------------------------

    def sample(self) -> Sample:
        m = self.rt.metrics
        s = Sample(time.time())
        for labels, v in _counter_totals(m.requests):
            pk = f"{labels['policy']}/{labels['pool']}"
            s.pools[pk] = s.pools.get(pk, 0.0) + v
            rk = f"{labels['policy']}/{labels['rule']}"
            s.rules[rk] = s.rules.get(rk, 0.0) + v
            xk = f"{pk}/{labels['replica']}"
            s.replicas[xk] = s.replicas.get(xk, 0.0) + v
            if labels["code"].isdigit() and int(labels["code"]) >= 500:
                s.errors[pk] = s.errors.get(pk, 0.0) + v
        for labels, v in _counter_totals(m.classifier_fail_open):
            s.fail_open[labels["policy"]] = v
        s.rejected = sum(v for _, v in _counter_totals(m.rejected))
        for labels, v in _counter_totals(m.tokens):
            s.tokens.setdefault(f"{labels['policy']}/{labels['pool']}", {})[labels["kind"]] = v
        for labels, v in _counter_totals(m.cost):
            s.cost[f"{labels['policy']}/{labels['pool']}"] = v
        self.lat_bounds, s.latency = _buckets(m.latency, "pool")
        clf_bounds, s.classifier = _buckets(m.classifier_latency, "kind")
        if clf_bounds:
            self.clf_bounds = clf_bounds
        return s

    def push(self, s: Sample) -> None:
        if self.samples:
            a = self.samples[-1]
            dt = max(s.t - a.t, 1e-3)
            self.steps.append((round(s.t, 2), {k: round(v / dt, 3) for k, v in _diff(s.pools, a.pools).items()},
                               {k: round(v / dt, 3) for k, v in _diff(s.rules, a.rules).items()}))
        self.samples.append(s)

    def start(self) -> None:
        self.push(self.sample())
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ui-sampler")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                self.push(self.sample())
            except Exception:  # a metrics hiccup must not end the dashboard's history
                continue

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    # --- the page's data ----------------------------------------------------------------

    def _ago(self, seconds: float, now: float) -> Sample:
        """The oldest sample no older than `seconds` (the first one when history is shorter)."""
        for s in self.samples:
            if now - s.t <= seconds + 0.5:
                return s
        return self.samples[-1]

    def snapshot(self, window: float = 60.0) -> dict[str, Any]:
        rt = self.rt
        now = time.time()
        cur = self.sample()  # now, so numbers are current between two background samples
        if not self.samples:
            self.push(cur)
        base = self.samples[0]
        rate_from = self._ago(RATE_S, now)
        win_from = self._ago(window, now)
        dt_rate = max(cur.t - rate_from.t, 1e-3)
        rps_pool = {k: v / dt_rate for k, v in _diff(cur.pools, rate_from.pools).items()}
        rps_rep = {k: v / dt_rate for k, v in _diff(cur.replicas, rate_from.replicas).items()}
        recent = [e for e in list(rt.recent) if now - e.at <= window]
        rep_lat: dict[str, list[float]] = {}
        for e in recent:
            rep_lat.setdefault(f"{e.decision.policy}/{e.pool}/{e.replica}", []).append(e.seconds)

        policies = []
        for lp in rt.gateway.policies():
            st = rt.gateway.store.status.get(lp.name) if rt.gateway.store else None
            pools = []
            for name, pool in lp.pools.items():
                key = f"{lp.name}/{name}"
                snap = pool.snapshot()
                lat = _diff_buckets(cur.latency.get(name, []), win_from.latency.get(name))
                for r in snap["replicas"]:
                    rk = f"{key}/{r['name']}"
                    lats = rep_lat.get(rk, [])
                    r["rps"] = round(rps_rep.get(rk, 0.0), 2)
                    r["count"] = int(cur.replicas.get(rk, 0.0))
                    r["p50_ms"] = _ms(_pct(lats, 0.5))
                    r["p99_ms"] = _ms(_pct(lats, 0.99))
                price = pool.spec.price
                pools.append({
                    "key": key, "name": name, **snap,
                    "total": len(snap["replicas"]),
                    "count": int(cur.pools.get(key, 0.0)),
                    "errors": int(cur.errors.get(key, 0.0)),
                    "rps": round(rps_pool.get(key, 0.0), 2),
                    "p50_ms": _ms(quantile(0.5, self.lat_bounds, lat)),
                    "p99_ms": _ms(quantile(0.99, self.lat_bounds, lat)),
                    "tokens": _tokens(cur.tokens.get(key)),
                    "tokens_window": _tokens(_diff(cur.tokens.get(key, {}), win_from.tokens.get(key, {}))),
                    "price": None if price is None else price.model_dump(),
                    "cost_usd": None if price is None else cur.cost.get(key, 0.0),
                    "cost_window_usd": None if price is None else
                    cur.cost.get(key, 0.0) - win_from.cost.get(key, 0.0),
                })
            policies.append({
                "name": lp.name, "file": str(lp.path), "classifier": lp.spec.classifier.kind,
                "last_reload": None if st is None else {"ok": st.ok, "at": st.at, "error": st.error or None},
                "pools": pools,
                "cost": {"total": savings(lp.spec, lp.name, cur, None), "window": savings(lp.spec, lp.name, cur, win_from)},
            })

        classifier = []
        for kind, counts in sorted(cur.classifier.items()):
            win = _diff_buckets(counts, win_from.classifier.get(kind))
            classifier.append({
                "kind": kind, "count": int(counts[-1]) if counts else 0, "window": int(win[-1]) if win else 0,
                "p50_ms": _ms(quantile(0.5, self.clf_bounds, win)),
                "p99_ms": _ms(quantile(0.99, self.clf_bounds, win)),
            })
        return {
            "now": now,
            "uptime_s": round(now - rt.started, 1),
            "window_s": window,
            "status": rt.health()["status"],
            "policies": policies,
            "split": {
                "window": {"pools": _diff(cur.pools, win_from.pools), "rules": _diff(cur.rules, win_from.rules)},
                "total": {"pools": cur.pools, "rules": cur.rules},
            },
            "series": self._series(),
            "classifier": classifier,
            "fail_open": {"total": cur.fail_open, "window": _diff(cur.fail_open, win_from.fail_open)},
            "rejected": int(cur.rejected),
            "since": base.t,
            "recent": [_decision(e) for e in list(rt.recent)[-RECENT_SHOWN:][::-1]],
        }

    def _series(self) -> dict[str, Any]:
        """Requests/s per pool and per rule for each second of the history."""
        steps = list(self.steps)
        pool_keys = sorted({k for _, p, _ in steps for k in p})
        rule_keys = sorted({k for _, _, r in steps for k in r})
        return {
            "t": [t for t, _, _ in steps],
            "pools": {k: [p.get(k, 0.0) for _, p, _ in steps] for k in pool_keys},
            "rules": {k: [r.get(k, 0.0) for _, _, r in steps] for k in rule_keys},
        }


def _tokens(t: dict[str, float] | None) -> dict[str, int]:
    t = t or {}
    return {k: int(t.get(k, 0.0)) for k in ("prompt", "completion", "cached")}


def savings(spec: PolicySpec, policy: str, cur: Sample, since: Sample | None) -> dict[str, Any] | None:
    """What the policy's answers cost and what the same tokens would have cost on its baseline pool
    (policy.schema.baseline_pool: `large`, else the priciest), since `since` (None: since start).
    Pools without a price are left out of both sums; None when no pool has a price."""
    base = baseline_pool(spec)
    if base is None:
        return None
    bprice = spec.pools[base].price
    assert bprice is not None
    spent = baseline = 0.0
    for name, ps in spec.pools.items():
        if ps.price is None:
            continue
        key = f"{policy}/{name}"
        t = cur.tokens.get(key, {})
        if since is not None:
            t = _diff(t, since.tokens.get(key, {}))
        spent += cur.cost.get(key, 0.0) - (since.cost.get(key, 0.0) if since is not None else 0.0)
        baseline += bprice.cost(int(t.get("prompt", 0)), int(t.get("completion", 0)), int(t.get("cached", 0)))
    saved = baseline - spent
    return {"baseline_pool": base, "spent_usd": spent, "baseline_usd": baseline, "saved_usd": saved,
            "saved_pct": round(100.0 * saved / baseline, 2) if baseline > 0 else None}


def _decision(e: RecentDecision) -> dict[str, Any]:
    d = e.decision
    return {
        "t": e.at, "policy": d.policy, "pool": e.pool, "routed_pool": d.pool, "rule": d.rule, "reason": d.reason,
        "label": d.label.name or None, "confidence": round(d.label.confidence, 3) if d.label.name else None,
        "classifier": d.label.kind, "classifier_ms": round(d.label.ms, 3) if d.label.name else None,
        "replica": e.replica, "status": e.status, "latency_ms": round(e.seconds * 1000.0, 2),
        "overhead_ms": round(e.overhead * 1000.0, 3), "session": d.session_id,
        "tokens": None if e.usage is None else {"prompt": e.usage.prompt, "completion": e.usage.completion,
                                                "cached": e.usage.cached},
        "cost_usd": e.cost,
    }
