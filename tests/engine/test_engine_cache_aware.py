"""strategy cache_aware against two real engine replicas (SmolLM2) behind the gateway: a
session's turns land on one replica, whose prefix cache then serves turn 2's repeated start
(usage.prompt_tokens_details.cached_tokens); distinct sessions spread over both replicas; and
with session.pin: replica, a session whose start changes mid-way (a client compacting its
history) stays on the replica that holds the rest of it, where cache_aware alone would move it.

Which replica a prefix hashes to depends on the replicas' URLs, so on this run's ports: the
test asks the ring (a pure function of the URLs, as every gateway computes it) which sessions
go where, picks sessions of both kinds, and checks that the gateway places them so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from engine_support import EngineServer
from procs import Proc, start_gateway

from switchyard.pools.affinity import CacheAware, prefix_key
from switchyard.pools.replica import Replica

NAMES = ("r0", "r1")  # conftest.replica_pair's: shipped int4 (outputs are not compared here), a thread each

POLICY = """
version: 1
name: {name}
pools:
  engines:
    model: smollm2-135m
    strategy: cache_aware
    health: {{interval: 0}}  # a check timing out on a loaded CI machine would take a replica out
    replicas: [{{url: '{r0}/v1', name: r0}}, {{url: '{r1}/v1', name: r1}}]
session: {{pin: {pin}}}
routes: [{{name: default, pool: engines}}]
"""


def _turn1(sid: int, model: str, first: str = "") -> dict[str, Any]:
    """An agent's first request: its own system prompt (~100 tokens: six blocks) and task."""
    system = (f"You are agent {sid}, who files crates for warehouse {sid * 7 % 13}. Tools: "
              + " ".join(f"tool {i} moves crate {i + sid} to dock {i % 3} and logs it." for i in range(6)))
    return {"model": model, "temperature": 0, "max_tokens": 2,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": first or f"Task {sid}: which dock gets crate {sid}?"}]}


def _turn2(turn1: dict[str, Any], reply: str) -> dict[str, Any]:
    return {**turn1, "messages": [*turn1["messages"], {"role": "assistant", "content": reply},
                                  {"role": "user", "content": "And the next crate?"}]}


class _Gateway:
    def __init__(self, proc: Proc, url: str) -> None:
        self.proc, self.url = proc, url
        self.client = httpx.Client(timeout=120, trust_env=False)

    def ask(self, body: dict[str, Any], session: str | None = None) -> tuple[str, str, int]:
        """(replica, reply, cached prompt tokens)."""
        r = self.client.post(self.url + "/v1/chat/completions", json=body,
                             headers={"x-session-id": session} if session else {})
        assert r.status_code == 200, r.text
        j = r.json()
        cached = (j["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return r.headers["x-switchyard-replica"], j["choices"][0]["message"]["content"], cached


@pytest.fixture(scope="module")
def setup(replica_pair: tuple[EngineServer, ...],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[_Gateway, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("cache_aware")
    urls = dict(zip(NAMES, (e.url for e in replica_pair), strict=True))
    files = []
    for name, pin in (("ca", "none"), ("pin", "replica")):
        files.append(tmp / f"{name}.yaml")
        files[-1].write_text(POLICY.format(name=name, pin=pin, **urls))
    proc, url = start_gateway(tmp, files, name="gw")
    gw = _Gateway(proc, url)
    try:
        yield gw, urls
    finally:
        gw.client.close()
        gw.proc.stop()


def _ring(urls: dict[str, str]) -> Callable[[dict[str, Any]], str]:
    """body -> the replica name the gateway's ring gives it on idle replicas."""
    ring = CacheAware()
    reps = [Replica(f"{u}/v1", n) for n, u in urls.items()]
    return lambda body: ring.pick(reps, prefix_key(body)).name


def test_cache_aware_keeps_sessions_on_their_prefix_and_spreads_them(setup: tuple[_Gateway, dict[str, str]]) -> None:
    gw, urls = setup
    where = _ring(urls)
    # Two sessions the ring gives each replica (of 32 candidates, all on one: 2 x 2^-32).
    picked: dict[str, list[int]] = {n: [] for n in NAMES}
    for sid in range(32):
        side = picked[where(_turn1(sid, "ca"))]
        if len(side) < 2:
            side.append(sid)
    assert all(len(v) == 2 for v in picked.values()), picked
    placed: dict[int, list[str]] = {}
    for expect, sids in picked.items():
        for sid in sids:
            t1 = _turn1(sid, "ca")
            rep1, reply, cached1 = gw.ask(t1)
            rep2, _, cached2 = gw.ask(_turn2(t1, reply))
            placed[sid] = [rep1, rep2]
            assert rep1 == rep2 == expect, (sid, placed[sid], expect)
            assert cached1 == 0, (sid, cached1)  # each session's prompt is its own
            assert cached2 >= 64, (sid, cached2)  # turn 1's system prompt: several 16-token blocks
    assert {p[0] for p in placed.values()} == set(NAMES), placed


def test_pin_replica_keeps_a_session_whose_start_changed(setup: tuple[_Gateway, dict[str, str]]) -> None:
    gw, urls = setup
    where = _ring(urls)
    sid = 100
    t1 = _turn1(sid, "pin")
    home = where(t1)
    # The same session with its first user message rewritten, to one the ring puts elsewhere.
    moved = next(b for k in range(64)
                 if where(b := _turn2(_turn1(sid, "pin", f"Task {sid}, restated ({k}): crates?"), "Dock 1.")) != home)
    rep1, _, _ = gw.ask(t1, session="agent-100")
    assert rep1 == home
    rep2, _, cached = gw.ask(moved, session="agent-100")
    assert rep2 == home, "session.pin: replica lost the session to the ring"
    assert cached > 0  # the system prompt is still cached there
    # Control: without the pin, the ring moves that body.
    rep3, _, _ = gw.ask({**moved, "model": "ca"})
    assert rep3 != home
