"""strategy least_load against test upstreams that publish engine metrics: vLLM's and SGLang's
names read, the engine's counts combined with the gateway's in-flight, and a replica whose
metrics stop answering balanced on in-flight counts once its last reading is stale.

(The same strategy against two real engine replicas: tests/engine/test_engine_least_load.py.)
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest
from procs import Proc, http_get, http_post, start_gateway, start_upstream

from switchyard.pools.least_load import load_score
from switchyard.pools.load import parse_metrics
from switchyard.pools.replica import EngineLoad, Replica

VLLM_IDLE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.05
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
"""
SGLANG_BUSY = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 6.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.7
"""

POLICY = """
version: 1
name: ll
pools:
  ll:
    model: m
    strategy: least_load
    load: {{interval: 100ms, stale: 2s, timeout: 1s}}
    health: {{interval: 0}}
    replicas: [{{url: {a}/v1, name: a}}, {{url: {b}/v1, name: b}}]
  li:
    model: m2
    strategy: least_inflight
    health: {{interval: 0}}
    replicas: [{{url: {a}/v1, name: a}}, {{url: {b}/v1, name: b}}]
routes:
  - {{name: default, pool: ll}}
"""


def test_metrics_of_each_engine_are_read() -> None:
    c = parse_metrics(VLLM_IDLE)
    assert c is not None and (c.running, c.waiting, c.kv) == (0.0, 0.0, 0.05)
    c = parse_metrics(SGLANG_BUSY)
    assert c is not None and (c.running, c.waiting, c.kv) == (6.0, 2.0, 0.7)
    llama = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\nllamacpp:kv_cache_usage_ratio 0.25\n"
    c = parse_metrics(llama)
    assert c is not None and (c.running, c.waiting, c.kv) == (2.0, 1.0, 0.25)
    # Two data-parallel engines: requests add up, KV usage averages.
    dp = ('vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 4\n'
          'vllm:gpu_cache_usage_perc{engine="0"} 0.2\nvllm:gpu_cache_usage_perc{engine="1"} 0.4\n')
    c = parse_metrics(dp)
    assert c is not None and (c.running, c.waiting) == (7.0, 0.0) and c.kv == pytest.approx(0.3)
    assert parse_metrics("process_cpu_seconds_total 12\n") is None
    assert parse_metrics("vllm:num_requests_running{ not prometheus\n") is None


def test_the_score_combines_the_reading_with_in_flight_counts() -> None:
    r = Replica("http://x/v1", "x")
    now = 100.0
    assert load_score(r, now, 5.0) == 0.0  # never read: in-flight alone
    r.engine = EngineLoad(running=4, waiting=1, kv=0.5, base=0, at=99.0)
    assert load_score(r, now, 5.0) == 5.5
    r.inflight = 3  # sent since the reading: the engine holds them too by now
    assert load_score(r, now, 5.0) == 8.5
    r.engine = EngineLoad(running=2, waiting=0, kv=None, base=3, at=99.0)
    r.inflight = 1  # two of the three read back then finished since
    assert load_score(r, now, 5.0) == 1.0 * 0 + max(2 + 1 - 3, 1)
    r.engine = EngineLoad(running=0, waiting=0, kv=None, base=5, at=99.0)
    r.inflight = 2  # never below what the gateway itself has in flight there
    assert load_score(r, now, 5.0) == 2.0
    assert load_score(r, 200.0, 5.0) == 2.0  # stale: in-flight alone


@dataclass
class Setup:
    gw: Proc
    url: str
    ups: dict[str, tuple[Proc, str]]

    def control(self, name: str, **kw) -> None:
        assert http_post(self.ups[name][1] + "/_control", orjson.dumps(kw))[0] == 200

    def replicas(self) -> dict[str, dict]:
        h = orjson.loads(http_get(self.url + "/health")[1])
        return {r["name"]: r for r in h["policies"]["ll"]["pools"]["ll"]["replicas"]}

    def split(self, model: str, n: int) -> dict[str, int]:
        out: dict[str, int] = {}
        body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        for _ in range(n):
            req = urllib.request.Request(self.url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                name = r.headers["x-switchyard-replica"]
            out[name] = out.get(name, 0) + 1
        return out


def wait(cond, timeout: float = 10.0, what: str = "") -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("least-load")
    ups = {n: start_upstream(tmp, n) for n in ("a", "b")}
    policy = tmp / "ll.yaml"
    policy.write_text(POLICY.format(a=ups["a"][1], b=ups["b"][1]))
    gw, url = start_gateway(tmp, [policy])
    yield Setup(gw, url, ups)
    gw.stop()
    for p, _ in ups.values():
        p.stop()


def test_least_load_sends_work_to_the_idle_engine(setup: Setup) -> None:
    setup.control("a", metrics=SGLANG_BUSY)  # busy with work the gateway never saw
    setup.control("b", metrics=VLLM_IDLE)
    wait(lambda: all((r.get("engine") or {}).get("running") is not None for r in setup.replicas().values()),
         what="both replicas' readings")
    reps = setup.replicas()
    assert reps["a"]["engine"]["running"] == 6 and reps["a"]["engine"]["waiting"] == 2
    assert reps["b"]["engine"]["kv_usage"] == 0.05 and reps["b"]["engine"]["read_by"] == "this gateway"
    assert setup.split("ll", 8) == {"b": 8}
    # least_inflight cannot see a's own work: equal in-flight counts, and a, never used, has the
    # lower latency average (its tie-break).
    assert setup.split("li", 8).get("a", 0) >= 1

    # a's metrics stop answering: its last reading goes stale, then in-flight counts decide alone
    # (ties by latency: b is made the slower one).
    setup.control("a", metrics=None)
    setup.control("b", delay_ms=30)
    try:
        wait(lambda: "404" in (setup.replicas()["a"]["engine"]["error"] or ""), what="a's metrics error")
        assert setup.split("ll", 2) == {"b": 2}  # a's last reading (6 running) still holds
        wait(lambda: setup.replicas()["a"]["engine"]["age_s"] > 2.2, what="a's reading to go stale")
        assert setup.split("ll", 8).get("a", 0) >= 6
    finally:
        setup.control("b", delay_ms=0)
