"""`strategy: cache_aware`: send a request to the replica most likely to hold its prefix in its
KV cache, while keeping load balanced.

An agent re-sends its whole history every turn; what stays the same is the start: the system
prompt, the tool definitions and the first user message. That start, hashed, is the request's
affinity key; consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018; as
HAProxy's hash-balance-factor) maps it onto a ring of the pool's replicas: the key's replica
takes it unless it already carries more than (1 + epsilon) x the mean load, in which case the
next replica clockwise does. A session's turns therefore land where their prefix was cached,
distinct prefixes spread over the ring, and no replica takes new keys past ~1.25x the mean. The ring
is a pure function of the replica URLs, so every gateway, with or without Redis, picks the same
replica with no shared state; loads are the in-flight counts (ours plus, with Redis, the other
gateways' leases).

A key seen before is sticky: the gateway remembers (the last 32k-64k keys, in two plain dicts the
cyclic GC never walks: the newer half and the one before it) which replica last served each key and sends it there while that replica is under a looser bound, (1 + 2
epsilon) x the mean, since moving it costs a prefill of its whole history where staying costs a
queue slot (SGLang's router also keeps cache affinity until the imbalance passes a threshold); a
key the bound did pass on is re-homed where it went, rather than sent back to a replica whose
copy of the conversation is a turn behind. New keys, which have nothing cached anywhere, are
placed by the ring under the tight bound, which keeps the load even. Measured with
bench/cache_routing.py (8 sessions x 6 turns over 2 replicas, each round a new ring): the ring
alone cached 0.842 of the prompt tokens of turns 2+ and moved 10% of them (3 rounds); with
stickiness 0.857 and 4% (6 rounds); pinning sessions by id reaches the trace's ceiling, 0.890.
Keys that were never passed on stay on their ring replica, so several gateways still agree;
each remembers only its own moves.

Chosen over SGLang router's approximate radix tree of prompts per replica: that tree lives in
one router's memory (several gateways would each need their own view, or a shared one), and
costs a walk of the prompt per request; the hash costs one digest of the prefix and needs no
state. What it gives up: a request whose start matches no earlier session's start is placed by
hash, not by the longest cached match.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from switchyard.pools.replica import Replica

VNODES = 160  # points per replica on the ring: ~uniform shares at a few replicas
EPSILON = 0.25  # a replica takes a key while its load is at most (1 + EPSILON) x the mean
HOMES = 65536  # keys whose last replica is remembered


def _h(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def prefix_key(body: Mapping[str, Any]) -> str | None:
    """The request's affinity key: a digest of what stays the same over a session's turns (its
    system/developer messages, its tools, its first user message); None when there is nothing
    to key on (then the strategy balances by load alone)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        head: list[Any] = []
        for m in messages:
            if not isinstance(m, dict):
                break
            head.append(m.get("content"))
            if m.get("role") == "user":
                break
        parts = [head, body.get("tools")]
    else:
        prompt = body.get("prompt")
        parts = [prompt[:2048] if isinstance(prompt, str) else prompt]  # a completion's start
    if not any(parts):
        return None
    try:
        data = orjson.dumps(parts)
    except (TypeError, orjson.JSONEncodeError):
        return None
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class CacheAware:
    """Consistent hashing with bounded loads over the candidates' URLs."""

    def __init__(self, epsilon: float = EPSILON, vnodes: int = VNODES, homes: int = HOMES) -> None:
        self.epsilon = epsilon
        self.vnodes = vnodes
        self.homes = homes
        # affinity key -> the URL that last served it: the keys seen since the last turn-over, and those
        # of the half before (looked up when a key is not in the newer). Plain dicts of strings stay
        # out of the cyclic GC; an OrderedDict of 64k would be walked on every full collection.
        self._home: dict[str, str] = {}
        self._home_old: dict[str, str] = {}
        self._turn = 0
        self._ring_for: tuple[str, ...] = ()
        self._points: list[int] = []
        self._owners: list[str] = []

    def _ring(self, urls: tuple[str, ...]) -> None:
        if urls == self._ring_for:
            return
        pts = sorted((_h(f"{u}#{i}".encode()), u) for u in urls for i in range(self.vnodes))
        self._points = [p for p, _ in pts]
        self._owners = [u for _, u in pts]
        self._ring_for = urls

    def pick(self, candidates: Sequence[Replica], affinity: str | None = None) -> Replica:
        if len(candidates) == 1:
            return candidates[0]
        if affinity is None:  # nothing to keep together: the least loaded, in turn among equals
            self._turn += 1
            n = len(candidates)
            return min((candidates[(self._turn + i) % n] for i in range(n)), key=lambda r: r.load)
        by_url = {r.url: r for r in candidates}
        total = sum(r.load for r in candidates)
        bound = math.ceil((1 + self.epsilon) * (total + 1) / len(candidates))
        url = self._home.get(affinity)
        home = by_url.get(url if url is not None else self._home_old.get(affinity, ""))
        # A key that was served before has its prefix cached there: moving it costs a prefill of its
        # whole history, waiting costs a queue slot, so it stays home up to (1 + 2 epsilon) x the
        # mean (SGLang's router likewise keeps cache affinity until the imbalance passes a
        # threshold). A new key has nothing cached anywhere: the tight bound places it.
        sticky = math.ceil((1 + 2 * self.epsilon) * (total + 1) / len(candidates))
        chosen = home if home is not None and home.load < sticky else self._walk(by_url, affinity, bound)
        if self.homes:
            self._home[affinity] = chosen.url
            if len(self._home) >= max(1, self.homes // 2):  # turn over: at most `homes` keys are kept
                self._home_old, self._home = self._home, {}
        return chosen

    def _walk(self, by_url: dict[str, Replica], affinity: str, bound: int) -> Replica:
        """The first replica clockwise from the key that is under the bound (else the least loaded)."""
        self._ring(tuple(sorted(by_url)))
        i = bisect.bisect(self._points, _h(affinity.encode())) % len(self._points)
        seen: set[str] = set()
        for k in range(len(self._points)):
            url = self._owners[(i + k) % len(self._points)]
            if url in seen:
                continue
            seen.add(url)
            r = by_url[url]
            if r.load < bound:
                return r
            if len(seen) == len(by_url):
                break
        return min(by_url.values(), key=lambda r: r.load)
