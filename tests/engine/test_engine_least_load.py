"""strategy least_load against two real engine replicas (SmolLM2): one kept busy by a client
that talks to it directly, past the gateway. The gateway's in-flight counts are blind to that
client; the engine's own metrics (vllm:num_requests_running, ...) are not.

Six requests sent at once through a least_load pool go to the idle replica; through a
least_inflight pool over the same two replicas they split evenly.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine_support import EngineServer, get, stream_iter
from procs import start_gateway

BUSY_STREAMS = 6  # the direct client's requests on the busy replica (the servers run 8 at most)
BURST = 6

POLICY = """
version: 1
name: engines
pools:
  ll:
    model: smollm2-135m
    strategy: least_load
    load: {{interval: 200ms, stale: 3s, timeout: 2s}}
    max_inflight_per_replica: 8
    replicas: [{{url: {busy}/v1, name: busy}}, {{url: {idle}/v1, name: idle}}]
  li:
    model: smollm2-135m
    strategy: least_inflight
    max_inflight_per_replica: 8
    replicas: [{{url: {busy}/v1, name: busy}}, {{url: {idle}/v1, name: idle}}]
routes: [{{name: default, pool: ll}}]
"""


def _keep_busy(url: str, stop: threading.Event) -> None:
    body = {"model": "smollm2-135m", "max_tokens": 200, "temperature": 0.8,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]}
    while not stop.is_set():
        try:
            for _ in stream_iter(url + "/v1/chat/completions", body, timeout=300):
                if stop.is_set():
                    break  # closing the response ends the request on the engine
        except OSError:
            time.sleep(0.1)


def _burst(gw: str, model: str) -> Counter:
    body = json.dumps({"model": model, "max_tokens": 8, "temperature": 0,
                       "messages": [{"role": "user", "content": "Say hi."}]}).encode()

    def one(_: int) -> str:
        req = urllib.request.Request(gw + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
            return r.headers["x-switchyard-replica"]

    with ThreadPoolExecutor(BURST) as pool:
        return Counter(pool.map(one, range(BURST)))


def _engine(gw: str, name: str) -> dict:
    _, h = get(gw + "/health")
    reps = h["policies"]["engines"]["pools"]["ll"]["replicas"]
    return next(r for r in reps if r["name"] == name).get("engine") or {}


def test_least_load_avoids_the_replica_a_direct_client_keeps_busy(replica_pair: tuple[EngineServer, ...],
                                                                  tmp_path: Path) -> None:
    """conftest.replica_pair: one thread each, so each decodes on one core."""
    busy, idle = replica_pair
    stop = threading.Event()
    clients = [threading.Thread(target=_keep_busy, args=(busy.url, stop), daemon=True) for _ in range(BUSY_STREAMS)]
    gw = None
    try:
        policy = tmp_path / "engines.yaml"
        policy.write_text(POLICY.format(busy=busy.url, idle=idle.url))
        gw, gw_url = start_gateway(tmp_path, [policy], name="gw-engines")
        for t in clients:
            t.start()
        deadline = time.time() + 120
        while (_engine(gw_url, "busy").get("running") or 0) < BUSY_STREAMS:
            assert time.time() < deadline, f"the busy replica never ran {BUSY_STREAMS}: {_engine(gw_url, 'busy')}"
            time.sleep(0.1)
        assert _engine(gw_url, "idle").get("running") == 0
        ll = _burst(gw_url, "ll")
        li = _burst(gw_url, "li")
        print(f"\nburst of {BURST} with the busy replica running {BUSY_STREAMS} direct streams: "
              f"least_load {dict(ll)}, least_inflight {dict(li)}")
        assert ll["idle"] == BURST, ll
        assert li["busy"] >= BURST // 2 - 1, li  # blind to the direct client: about half land on the busy one
    finally:
        stop.set()
        if gw is not None:
            gw.stop()
        for t in clients:
            if t.is_alive():
                t.join(30)
