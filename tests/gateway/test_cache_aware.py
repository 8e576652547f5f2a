"""`strategy: cache_aware`: a session's turns go to one replica, distinct prefixes spread, no
replica carries more than (1 + epsilon) x the mean; every gateway picks alike without shared
state. The ring itself, then the gateway process in front of real upstream processes."""

from __future__ import annotations

import collections
import random

import httpx
import pytest
from procs import start_gateway, start_upstream

from switchyard.pools.affinity import CacheAware, prefix_key
from switchyard.pools.replica import Replica


def _agent(sid: int, turns: int, tools: int = 3) -> list[dict]:
    """A session's requests: the same system prompt, tools and first user message, growing."""
    sysmsg = {"role": "system", "content": "You are a careful agent. " * 20}
    tool = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}} for i in range(tools)]
    msgs = [sysmsg, {"role": "user", "content": f"task number {sid}: plan it"}]
    out = []
    for t in range(turns):
        out.append({"model": "auto", "messages": list(msgs), "tools": tool, "max_tokens": 4})
        msgs += [{"role": "assistant", "content": f"step {t}"}, {"role": "tool", "tool_call_id": str(t), "content": "ok"},
                 {"role": "user", "content": f"next {t}"}]
    return out


def test_prefix_key_is_the_start_of_the_conversation():
    turns = _agent(1, 3)
    keys = {prefix_key(b) for b in turns}
    assert len(keys) == 1 and None not in keys  # every turn of a session: one key
    assert prefix_key(_agent(2, 1)[0]) not in keys  # another task: another key
    assert prefix_key({"messages": []}) is None


def test_ring_keeps_keys_and_bounds_load():
    reps = [Replica(f"http://r{i}:80/v1", f"r{i}") for i in range(4)]
    s = CacheAware(homes=0)  # the ring alone: no memory of where keys went
    keys = [prefix_key(_agent(i, 1)[0]) for i in range(400)]
    first = [s.pick(reps, k).url for k in keys]
    assert first == [s.pick(reps, k).url for k in keys]  # a pure function of the key (loads equal)
    assert max(collections.Counter(first).values()) < 160  # ~100 each: spread
    # A fifth replica takes only its share: most keys stay where they were.
    more = [*reps, Replica("http://r4:80/v1", "r4")]
    moved = sum(a != s.pick(more, k).url for a, k in zip(first, keys, strict=True))
    assert moved < 0.35 * len(keys)
    # Bounded load: when the key's replica is over (1 + eps) x mean, the next one takes it.
    rng = random.Random(7)
    for r in reps:
        r.inflight = 0
    for _ in range(2000):
        k = keys[rng.randrange(8)]  # few hot prefixes: pure hashing would pile them on one or two replicas
        r = s.pick(reps, k)
        r.inflight += 1
        mean = sum(x.inflight for x in reps) / len(reps)
        assert max(x.inflight for x in reps) <= (1 + s.epsilon) * mean + 1


def test_a_key_the_bound_moved_stays_where_it_went():
    reps = [Replica(f"http://r{i}:80/v1", f"r{i}") for i in range(2)]
    s = CacheAware()
    key, other_key = (prefix_key(_agent(i, 1)[0]) for i in (1, 2))
    ring = s.pick(reps, key)
    moved_to = next(r for r in reps if r is not ring)
    ring.inflight = 5  # over the bound, ceil(1.25 x (5 + 1) / 2) = 4: passed on
    assert s.pick(reps, key) is moved_to
    ring.inflight = 1  # under it again, but the key's newest prefix is on the other replica now
    assert s.pick(reps, key) is moved_to
    moved_to.inflight = 9  # that one over the bound: the ring's choice again
    assert s.pick(reps, key) is ring
    ring.inflight = moved_to.inflight = 0
    # A key never passed on goes where the ring puts it, so a gateway without this one's memory agrees.
    assert s.pick(reps, other_key) is CacheAware().pick(reps, other_key)


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_gateway_sends_a_sessions_turns_to_one_replica_and_spreads_sessions(tmp_path):
    ups = [start_upstream(tmp_path, f"r{i}") for i in range(2)]
    replicas = "".join(f"      - {{url: '{u}/v1', name: r{i}}}\n" for i, (_, u) in enumerate(ups))
    pol = tmp_path / "p.yaml"
    pol.write_text("version: 1\nname: p\npools:\n  small:\n    model: m\n    strategy: cache_aware\n"
                   f"    replicas:\n{replicas}routes:\n  - {{name: default, pool: small}}\n")
    gws = [start_gateway(tmp_path, [pol], name=f"gw{i}") for i in range(2)]
    try:
        placed: dict[int, set[str]] = collections.defaultdict(set)
        with httpx.Client(timeout=10, trust_env=False) as c:
            for sid in range(12):
                for t, body in enumerate(_agent(sid, 4)):
                    _, url = gws[t % 2]  # turns alternate between two gateways: no shared state
                    r = c.post(url + "/v1/chat/completions", json=body)
                    assert r.status_code == 200
                    placed[sid].add(r.headers["x-switchyard-replica"])
        assert all(len(v) == 1 for v in placed.values()), placed  # each session stayed on one replica
        spread = collections.Counter(next(iter(v)) for v in placed.values())
        assert set(spread) == {"r0", "r1"}, spread  # distinct prefixes use both
    finally:
        for gw, _ in gws:
            gw.stop()
        for p, _ in ups:
            p.stop()
