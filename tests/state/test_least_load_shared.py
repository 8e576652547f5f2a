"""least_load with several gateways on one Redis: each replica's metrics are read by one gateway
and its readings shared, so the replica is scraped once an interval, not once per gateway; the
other gateway balances on the shared readings; when the reading gateway dies, the survivor
reads the replica itself."""

from __future__ import annotations

import time

import orjson
import pytest
from procs import http_get, http_post, start_gateway, start_upstream
from statekit import RedisServer, wait_for

pytestmark = pytest.mark.slow  # gateways and upstreams of its own on a redis-server: `make test`

BUSY = "vllm:num_requests_running 5\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.4\n"
IDLE = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.0\n"
POLICY = """
version: 1
name: ll
pools:
  p:
    model: m
    strategy: least_load
    load: {{interval: 200ms, stale: 3s}}
    health: {{interval: 0}}
    replicas: [{{url: {a}/v1, name: a}}, {{url: {b}/v1, name: b}}]
routes: [{{name: default, pool: p}}]
"""


def engine(url: str, name: str) -> dict:
    h = orjson.loads(http_get(url + "/health")[1])
    reps = h["policies"]["ll"]["pools"]["p"]["replicas"]
    return next(r for r in reps if r["name"] == name).get("engine") or {}


def state(url: str) -> dict:
    return orjson.loads(http_get(url + "/health")[1])["state"]


def scrapes(ups: dict, name: str) -> int:
    return orjson.loads(http_get(ups[name][1] + "/_state")[1])["metrics_served"]


def test_one_gateway_reads_each_replica_and_shares_it(tmp_path) -> None:
    rs = RedisServer(tmp_path)
    ups = {n: start_upstream(tmp_path, n) for n in ("a", "b")}
    gws = []
    try:
        for n, text in (("a", BUSY), ("b", IDLE)):
            assert http_post(ups[n][1] + "/_control", orjson.dumps({"metrics": text}))[0] == 200
        policy = tmp_path / "ll.yaml"
        policy.write_text(POLICY.format(a=ups["a"][1], b=ups["b"][1]))
        for name in ("gw1", "gw2"):
            gws.append(start_gateway(tmp_path, [policy], "--redis", rs.url, name=name))
        (g1, u1), (g2, u2) = gws
        # Each gateway learns both replicas' loads, one of them read by the other gateway.
        for u in (u1, u2):
            wait_for(lambda u=u: all(engine(u, n).get("running") is not None for n in ("a", "b")),
                     what="both readings")
        wait_for(lambda: any(engine(u, n).get("read_by") == "another gateway" for u in (u1, u2) for n in "ab"),
                 what="a reading shared by the other gateway")
        assert engine(u2, "a")["running"] == 5 and engine(u1, "a")["running"] == 5
        # Scraped about once an interval (200 ms), not once per gateway: 3 s give ~15 reads each
        # (~30 unshared). A gateway that loses Redis for a moment reads everything itself (as it
        # must), so a window in which either saw an outage does not count; three tries.
        counted = []
        for _ in range(3):
            outages = [state(u)["outages"] for u in (u1, u2)]
            before = {n: scrapes(ups, n) for n in "ab"}
            time.sleep(3.0)
            got = {n: scrapes(ups, n) - before[n] for n in "ab"}
            if [state(u)["outages"] for u in (u1, u2)] == outages:
                counted.append(got)
                if all(5 <= v <= 21 for v in got.values()):
                    break
        assert counted and all(5 <= v <= 21 for v in counted[-1].values()), counted
        # Both gateways send new work to the idle replica, whoever read it.
        body = orjson.dumps({"model": "ll", "messages": [{"role": "user", "content": "hi"}]})
        for u in (u1, u2):
            for _ in range(4):
                st, raw = http_post(u + "/v1/chat/completions", body)
                assert st == 200 and orjson.loads(raw)["system_fingerprint"] == "b"
        # The gateway that read a replica dies: the other reads it itself.
        reader = u1 if any(engine(u2, n).get("read_by") == "another gateway" for n in "ab") else u2
        survivor = u2 if reader == u1 else u1
        (g1 if reader == u1 else g2).stop()
        assert http_post(ups["a"][1] + "/_control", orjson.dumps({"metrics": IDLE}))[0] == 200
        assert http_post(ups["b"][1] + "/_control", orjson.dumps({"metrics": BUSY}))[0] == 200
        wait_for(lambda: engine(survivor, "a")["running"] == 0 and engine(survivor, "b")["running"] == 5,
                 timeout=10, what="the survivor reading both replicas")
        assert all(engine(survivor, n)["read_by"] == "this gateway" for n in "ab")
    finally:
        for g, _ in gws:
            g.stop()
        for p, _ in ups.values():
            p.stop()
        rs.stop()
