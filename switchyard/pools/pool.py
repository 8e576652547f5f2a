"""A pool: the replicas of one model, a strategy to pick among them, and a bounded wait queue."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import deque
from dataclasses import dataclass, field

import aiohttp

from switchyard.policy.envrefs import REF, EnvAllow
from switchyard.policy.schema import PoolSpec, ReplicaSpec
from switchyard.pools.balancer import Strategy, make_strategy
from switchyard.pools.replica import CircuitBreaker, Replica, make_replica, public_url


class NoHealthyReplica(Exception):
    """Every replica of the pool is unhealthy, ejected or draining."""


class NoCapacity(Exception):
    """Every replica is at max_inflight and the queue is full or the wait timed out."""

    def __init__(self, pool: str, retry_after: float):
        self.pool = pool
        self.retry_after = retry_after
        super().__init__(f"pool {pool!r} is at capacity")


@dataclass(eq=False)
class Pool:
    name: str
    spec: PoolSpec
    replicas: list[Replica]
    strategy: Strategy
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    env: EnvAllow = field(default_factory=EnvAllow)  # the ${NAME}s its api_key may expand
    timeout: aiohttp.ClientTimeout = field(init=False)
    upstream_headers: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.timeout = aiohttp.ClientTimeout(
            total=self.spec.timeout, sock_connect=self.spec.connect_timeout
        )
        self.upstream_headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        key = expand_env(self.spec.api_key, f"pool {self.name!r}: api_key", self.env) if self.spec.api_key else None
        if key:
            self.upstream_headers["Authorization"] = f"Bearer {key}"

    @property
    def model(self) -> str:
        return self.spec.model

    def _candidates(self, now: float, exclude: set[Replica] | None) -> tuple[list[Replica], bool]:
        """Replicas that can take a request now, and whether any replica is usable at all."""
        limit = self.spec.max_inflight_per_replica
        usable = False
        out = []
        for r in self.replicas:
            if not r.available(now) or (exclude and r in exclude):
                continue
            usable = True
            if r.load < limit:
                out.append(r)
        return out, usable

    def try_acquire(self, exclude: set[Replica] | None = None, prefer: str | None = None,
                    affinity: str | None = None) -> Replica | None:
        now = time.monotonic()
        cands, usable = self._candidates(now, exclude)
        if not cands:
            if not usable:
                raise NoHealthyReplica(self.name)
            return None
        r = None
        if prefer is not None:
            r = next((c for c in cands if c.url == prefer), None)
        if r is None:
            r = self.strategy.pick(cands, affinity)
        r.inflight += 1
        r.breaker.on_start()
        return r

    async def acquire(self, exclude: set[Replica] | None = None, prefer: str | None = None,
                      affinity: str | None = None) -> Replica:
        """A replica with a free slot, waiting in the queue if all are busy.

        Raises NoHealthyReplica (go to the fallback pool now) or NoCapacity (queue full / timed out).
        """
        r = self.try_acquire(exclude, prefer, affinity)
        if r is not None:
            return r
        if len(self.waiters) >= self.spec.queue_size:
            raise NoCapacity(self.name, retry_after=max(1.0, self.spec.queue_timeout))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.spec.queue_timeout
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            self.waiters.append(fut)
            try:
                await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise NoCapacity(self.name, retry_after=max(1.0, self.spec.queue_timeout)) from None
            finally:
                if not fut.done():
                    fut.cancel()
                try:
                    self.waiters.remove(fut)
                except ValueError:
                    pass
            r = self.try_acquire(exclude, prefer, affinity)
            if r is not None:
                return r
            if loop.time() >= deadline:
                raise NoCapacity(self.name, retry_after=max(1.0, self.spec.queue_timeout))

    def wake_one(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def snapshot(self) -> dict:
        return {
            "model": self.model,
            "strategy": self.spec.strategy,
            "queued": len(self.waiters),
            "healthy": sum(1 for r in self.replicas if r.state == "healthy"),
            "replicas": [r.snapshot() for r in self.replicas],
        }


def expand_env(value: str, what: str, allow: EnvAllow | None = None) -> str:
    """'${NAME}' (anywhere in the value) -> that environment variable; ValueError if it is unset,
    EnvNotAllowed (a ValueError) if the operator did not allow policies to read it."""
    (allow or EnvAllow()).check(value, what)

    def sub(m: re.Match[str]) -> str:
        got = os.environ.get(m.group(1))
        if got is None:
            raise ValueError(f"{what}: the environment variable {m.group(1)} is not set")
        return got

    return REF.sub(sub, value)


def release(replica: Replica) -> None:
    """A request finished on `replica`: free its slot and let one queued request in."""
    replica.inflight -= 1
    for pool in replica.pools:
        pool.wake_one()
    if replica.inflight == 0 and replica.on_idle is not None:
        replica.on_idle(replica)


class ReplicaRegistry:
    """Replicas by URL, shared by every pool and policy that names them and kept across reloads,
    so in-flight counts, circuit state and connections survive a policy edit."""

    def __init__(self, env: EnvAllow | None = None) -> None:
        self.env = env or EnvAllow()
        self.by_url: dict[str, Replica] = {}
        self._closing: set[asyncio.Task[None]] = set()  # held so that aclose can wait for them

    def get(self, spec: ReplicaSpec, pool: PoolSpec) -> Replica:
        # Keyed by the URL without userinfo (what sync shares and admin shows); an edit that
        # changes only the credentials keeps the replica and takes its new ones.
        r = self.by_url.get(public_url(spec.url))
        if r is None:
            r = make_replica(spec.url, spec.name, CircuitBreaker(pool.circuit.failures, pool.circuit.cooldown),
                             pool.health.path)
            self.by_url[r.url] = r
        else:
            r.auth = make_replica(spec.url, None, r.breaker, None).auth
            r.breaker.failures_to_open = pool.circuit.failures
            r.breaker.cooldown = pool.circuit.cooldown
            if spec.name:
                r.name = spec.name
        return r

    def build_pool(self, name: str, spec: PoolSpec) -> Pool:
        if isinstance(spec.replicas, int):
            raise ValueError(
                f"pool {name!r} lists a replica count ({spec.replicas}), not URLs: this is a planning "
                "policy; run `switchyard plan --emit DIR` and serve the policy it writes"
            )
        replicas = [self.get(rs, spec) for rs in spec.replicas]
        weights = {public_url(rs.url): rs.weight for rs in spec.replicas}  # as Replica.url: no userinfo
        return Pool(name, spec, replicas, make_strategy(spec.strategy, weights, spec.load), env=self.env)

    def attach(self, pools: list[Pool]) -> None:
        """Point each replica at the pools that use it now (after a policy set changed)."""
        for r in self.by_url.values():
            r.pools = []
        for p in pools:
            for r in p.replicas:
                if p not in r.pools:
                    r.pools.append(p)
                r.on_idle = None  # used again: a later edit decides whether it goes

    async def prune(self) -> list[str]:
        """Close the connection pools of replicas that no pool uses any more (a policy edit dropped
        them) and forget them. One still serving a request is closed when its last request ends
        (`release` calls its `on_idle`): no later edit need come for it."""
        gone = []
        for url, r in list(self.by_url.items()):
            if r.pools:
                continue
            # Armed on the closed ones too: a request of the old policy may still retry onto one
            # (it reopens a session), and that session must not outlive the request either.
            r.on_idle = self._idle
            if r.inflight == 0:
                del self.by_url[url]
                await r.aclose()
                gone.append(url)
        return gone

    def _idle(self, r: Replica) -> None:
        """The last request on a dropped replica ended: forget it and close its connection pool."""
        if r.pools:
            return
        if self.by_url.get(r.url) is r:
            del self.by_url[r.url]
        task = asyncio.get_running_loop().create_task(r.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        for r in self.by_url.values():
            await r.aclose()
