"""Prometheus metrics: counters and histograms on the request path, gauges read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from switchyard.gateway.usage import Usage
from switchyard.pools.pool import Pool

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1)
CLASSIFIER_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.025, 0.1, 0.2, 0.5, 1.0)
CIRCUIT_VALUE = {"closed": 0, "half_open": 1, "open": 2}


class _LiveState(Collector):
    """In-flight, queue, health and circuit gauges, read from the pools when scraped (no request-path cost)."""

    def __init__(self, pools: Callable[[], Iterable[tuple[str, Pool]]], state_ok: Callable[[], tuple[str, bool]]):
        self._pools = pools
        self._state_ok = state_ok

    def collect(self):
        inflight = GaugeMetricFamily("switchyard_inflight", "Requests in flight", labels=["pool", "replica"])
        queued = GaugeMetricFamily("switchyard_queued", "Requests waiting for a slot", labels=["pool"])
        healthy = GaugeMetricFamily("switchyard_replica_healthy", "1 when the replica takes traffic", labels=["pool", "replica"])
        circuit = GaugeMetricFamily(
            "switchyard_circuit_state", "Circuit breaker: 0 closed, 1 half-open, 2 open", labels=["pool", "replica"]
        )
        ewma = GaugeMetricFamily("switchyard_replica_latency_ewma_seconds", "EWMA latency", labels=["pool", "replica"])
        price = GaugeMetricFamily("switchyard_price_usd_per_million_tokens",
                                  "A pool's price (policy `price`), for cost queries", labels=["policy", "pool", "kind"])
        seen = set()
        for pool_key, pool in self._pools():
            if pool_key in seen:
                continue
            seen.add(pool_key)
            queued.add_metric([pool_key], len(pool.waiters))
            p = pool.spec.price
            if p is not None:
                policy, _, name = pool_key.rpartition("/")
                for kind, v in (("prompt", p.prompt), ("completion", p.completion),
                                ("cached", p.prompt if p.cached is None else p.cached)):
                    price.add_metric([policy, name, kind], v)
            for r in pool.replicas:
                inflight.add_metric([pool_key, r.name], r.inflight)
                healthy.add_metric([pool_key, r.name], 1.0 if r.state == "healthy" else 0.0)
                circuit.add_metric([pool_key, r.name], CIRCUIT_VALUE.get(r.breaker.state, 2))
                ewma.add_metric([pool_key, r.name], r.ewma_ms / 1000.0)
        kind, ok = self._state_ok()
        store = GaugeMetricFamily("switchyard_state_store_up", "1 when the state store answers", labels=["kind"])
        store.add_metric([kind], 1.0 if ok else 0.0)
        yield from (inflight, queued, healthy, circuit, ewma, store, price)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "switchyard_requests", "Requests by outcome",
            ["policy", "pool", "replica", "rule", "code"], registry=r,
        )
        self.latency = Histogram(
            "switchyard_request_seconds", "Whole request latency seen by the client (to the last byte)",
            ["pool"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.overhead = Histogram(
            "switchyard_overhead_seconds", "Time the gateway itself added to a request",
            ["pool"], buckets=OVERHEAD_BUCKETS, registry=r,
        )
        self.retries = Counter("switchyard_retries", "Attempts retried on another replica", ["pool"], registry=r)
        self.fallbacks = Counter("switchyard_fallbacks", "Requests sent on to a fallback pool", ["src", "dst"], registry=r)
        self.upstream_errors = Counter(
            "switchyard_upstream_errors", "Failed upstream attempts", ["pool", "replica", "reason"], registry=r
        )
        self.rejected = Counter("switchyard_rejected", "Requests refused before routing", ["code"], registry=r)
        self.client_stalls = Counter(
            "switchyard_client_stalls", "Connections closed because the client stopped reading a response", registry=r)
        self.classifier_latency = Histogram(
            "switchyard_classifier_seconds", "Classifier time per request", ["kind"], buckets=CLASSIFIER_BUCKETS, registry=r
        )
        self.classifier_fail_open = Counter(
            "switchyard_classifier_fail_open", "Classifier failures that fell back to on_failure", ["policy"], registry=r
        )
        self.tokens = Counter(
            "switchyard_tokens", "Tokens from upstream usage (prompt includes cached)", ["policy", "pool", "kind"],
            registry=r)
        self.cost = Counter("switchyard_cost_usd", "What answers cost at the pool's price", ["policy", "pool"],
                            registry=r)
        self._latency_children: dict[str, tuple] = {}
        self._request_children: dict[tuple, object] = {}  # (policy, pool, replica, rule, code) -> counter
        self._token_children: dict[tuple[str, str], tuple] = {}

    def attach_live(self, pools: Callable[[], Iterable[tuple[str, Pool]]], state_ok: Callable[[], tuple[str, bool]]) -> None:
        self.registry.register(_LiveState(pools, state_ok))

    def observe(self, policy: str, pool: str, replica: str, rule: str, code: int, seconds: float, overhead: float) -> None:
        children = self._latency_children.get(pool)
        if children is None:
            children = (self.latency.labels(pool), self.overhead.labels(pool))
            self._latency_children[pool] = children
        children[0].observe(seconds)
        children[1].observe(overhead)
        key = (policy, pool, replica, rule, code)
        counter = self._request_children.get(key)
        if counter is None:  # labels() takes a lock and builds its key every call
            counter = self.requests.labels(policy, pool, replica, rule, str(code))
            if len(self._request_children) < 4096:
                self._request_children[key] = counter
        counter.inc()  # type: ignore[attr-defined]

    def account(self, policy: str, pool: str, usage: Usage, cost: float | None) -> None:
        """One answer's usage (and its cost, when the pool has a price)."""
        children = self._token_children.get((policy, pool))
        if children is None:
            children = (self.tokens.labels(policy, pool, "prompt"), self.tokens.labels(policy, pool, "completion"),
                        self.tokens.labels(policy, pool, "cached"), self.cost.labels(policy, pool))
            self._token_children[(policy, pool)] = children
        children[0].inc(usage.prompt)
        children[1].inc(usage.completion)
        if usage.cached:
            children[2].inc(usage.cached)
        if cost is not None:
            children[3].inc(cost)

    # pools/dispatch.DispatchEvents: what the dispatcher reports as it goes.

    def retried(self, pool: str) -> None:
        self.retries.labels(pool).inc()

    def fell_back(self, src: str, dst: str) -> None:
        self.fallbacks.labels(src, dst).inc()

    def upstream_failed(self, pool: str, replica: str, reason: str) -> None:
        self.upstream_errors.labels(pool, replica, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
