"""/metrics: vLLM's metric names over the scheduler's counters, so the gateway's least-load
balancer and dashboards read our replicas as they read vLLM's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from switchyard.engine.serving.state import EngineState


class Metrics:
    def __init__(self, state: EngineState) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", labels,
                             registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting for a slot", labels,
                             registry=self.registry)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV cache usage: share of the blocks held by requests (1 = full)",
                        labels, registry=self.registry)
        self.cache_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                     labels, registry=self.registry)
        self.cache_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache", labels,
                                  registry=self.registry)
        self.preemptions = Counter("vllm:num_preemptions", "Requests preempted for want of KV blocks", labels,
                                   registry=self.registry)
        self.prompt = Counter("vllm:prompt_tokens", "Prefilled tokens", labels, registry=self.registry)
        self.gen = Counter("vllm:generation_tokens", "Generated tokens", labels, registry=self.registry)
        self.success = Counter("vllm:request_success", "Finished requests", labels + ["finished_reason"],
                               registry=self.registry)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token", labels,
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                              registry=self.registry)
        self.healthy = Gauge("switchyard_engine_ready", "1 when the replica serves", labels,
                             registry=self.registry)
        self.state = state
        self._seen = {"prompt_tokens": 0, "generation_tokens": 0, "preemptions": 0, "queries": 0, "hits": 0}
        self._seen_reason: dict[str, int] = {}
        name = state.model_name
        for g in (self.running, self.waiting, self.kv, self.healthy):
            g.labels(name).set(0)  # present from the first scrape, before the engine is up
        for c in (self.prompt, self.gen, self.cache_queries, self.cache_hits, self.preemptions):
            c.labels(name)

    def render(self) -> bytes:
        st, name = self.state, self.state.model_name
        s = st.scheduler
        if s is not None:
            self.running.labels(name).set(s.num_running)
            self.waiting.labels(name).set(s.num_waiting)
            self.kv.labels(name).set(s.kv_usage)
            totals = {**s.output.stats, "queries": s.pool.queries, "hits": s.pool.hits}
            for key, counter in (("prompt_tokens", self.prompt), ("generation_tokens", self.gen),
                                 ("preemptions", self.preemptions), ("queries", self.cache_queries),
                                 ("hits", self.cache_hits)):
                now = totals[key]
                counter.labels(name).inc(now - self._seen[key])
                self._seen[key] = now
            for reason, n in s.output.finished_by_reason.items():
                self.success.labels(name, reason).inc(n - self._seen_reason.get(reason, 0))
                self._seen_reason[reason] = n
            fresh, s.output.ttft = s.output.ttft, []
            for v in fresh:
                self.ttft.labels(name).observe(v)
        self.healthy.labels(name).set(1 if st.ready else 0)
        return generate_latest(self.registry)
