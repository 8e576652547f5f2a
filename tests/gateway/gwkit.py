"""A gateway process in front of three real upstream processes, shared by a test module."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from procs import Proc, http_post, start_gateway, start_upstream, stop_all


@dataclass
class Cluster:
    tmp: Path
    ups: dict[str, tuple[Proc, str]]
    gw: Proc
    url: str
    policy: Path

    def control(self, name: str, **settings) -> None:
        status, _ = http_post(self.ups[name][1] + "/_control", orjson.dumps(settings))
        assert status == 200

    def upstream_state(self, name: str) -> dict:
        from procs import http_get

        return orjson.loads(http_get(self.ups[name][1] + "/_state")[1])

    def reset(self) -> None:
        for name, (proc, _) in self.ups.items():
            if proc.p.poll() is None:
                self.control(name, delay_ms=0, fail=0, fail_first=0, die_midstream=False, health=200,
                             tool_call=None, chunk_delay_ms=0, cancelled=0, cached_tokens=0, metrics=None)


POLICY = """
version: 1
name: test
pools:
  small:
    model: small-model
    max_inflight_per_replica: {max_inflight}
    queue_size: {queue_size}
    queue_timeout: 300ms
    timeout: {timeout}
    circuit: {{failures: 3, cooldown: 1s}}
    health: {{interval: 0.5s, timeout: 0.5s}}
    replicas:
      - {{url: {s0}/v1, name: s0}}
      - {{url: {s1}/v1, name: s1}}
  large:
    model: large-model
    health: {{interval: 0.5s, timeout: 0.5s}}
    replicas:
      - {{url: {l0}/v1, name: l0}}
session:
  pin: {pin}
routes:
  - name: many-tools
    when: {{tools: ">= 3"}}
    pool: large
  - name: vip
    when: {{header.x-tenant: gold}}
    pool: large
  - name: keyword
    when: {{text: "(?i)hard problem"}}
    pool: large
  - name: split
    when: {{text: "(?i)^split"}}
    pool: {{large: 50, small: 50}}
  - name: default
    pool: small
fallback:
  small: [large]
"""


def make_cluster(tmp: Path, *, max_inflight: int = 32, queue_size: int = 64, timeout: str = "10s",
                 pin: str = "none") -> Cluster:
    ups = {n: start_upstream(tmp, n) for n in ("s0", "s1", "l0")}
    policy = tmp / "test.yaml"
    policy.write_text(POLICY.format(max_inflight=max_inflight, queue_size=queue_size, timeout=timeout, pin=pin,
                                    s0=ups["s0"][1], s1=ups["s1"][1], l0=ups["l0"][1]))
    gw, url = start_gateway(tmp, [policy])
    return Cluster(tmp, ups, gw, url, policy)


def stop_cluster(c: Cluster) -> None:
    stop_all([c.gw, *(proc for proc, _ in c.ups.values())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = make_cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    stop_cluster(c)


@pytest.fixture
def fresh(cluster: Cluster) -> Cluster:
    cluster.reset()
    return cluster
