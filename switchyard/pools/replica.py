"""One upstream server: its health, its circuit breaker, its load, its HTTP connection pool."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp

from switchyard.pools.upstream import UpstreamPool

EWMA_ALPHA = 0.2


class Waiters(Protocol):
    """What a replica knows of a pool that uses it: its name, and how to let one queued request in."""

    name: str

    def wake_one(self) -> None: ...


@dataclass(slots=True)
class CircuitBreaker:
    """closed -> (N consecutive failures) -> open -> (cooldown) -> half_open -> one trial -> closed/open."""

    failures_to_open: int = 3
    cooldown: float = 10.0
    state: str = "closed"
    consecutive_failures: int = 0
    opened_at: float = 0.0
    trial_in_flight: bool = False
    opens: int = 0
    last_error: str = ""

    def allows(self, now: float) -> bool:
        if self.state == "closed":
            return True
        if self.state == "open" and now - self.opened_at >= self.cooldown:
            self.state = "half_open"
        if self.state == "half_open":
            return not self.trial_in_flight
        return False

    def on_start(self) -> None:
        if self.state == "half_open":
            self.trial_in_flight = True

    def on_success(self) -> None:
        self.consecutive_failures = 0
        self.trial_in_flight = False
        self.state = "closed"

    def on_failure(self, reason: str, now: float) -> bool:
        """Record a failure; True when this failure opened the circuit."""
        self.last_error = reason
        self.trial_in_flight = False
        self.consecutive_failures += 1
        if self.state == "half_open" or (
            self.state == "closed" and self.consecutive_failures >= self.failures_to_open
        ):
            self.state = "open"
            self.opened_at = now
            self.opens += 1
            return True
        return False

    def force_open(self, until: float, reason: str, now: float) -> None:
        """Open because another gateway did (shared state): stay open until `until`."""
        self.state = "open"
        self.opened_at = now - max(0.0, self.cooldown - (until - now))
        self.last_error = reason


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One reading of a replica's own metrics (pools/load.py), for strategy least_load."""

    running: float  # requests in the engine's running batch
    waiting: float  # requests queued in the engine
    kv: float | None  # KV-cache usage, 0..1 (None: not published)
    base: int  # the gateways' in-flight count on the replica when it was read
    at: float  # monotonic time of the reading
    shared: bool = False  # read by another gateway (shared through the state store)


@dataclass(eq=False)
class Replica:
    url: str  # base URL ending in /v1
    name: str
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    healthy: bool = True  # last active health check (optimistic until the first one)
    health_error: str = ""
    draining: bool = False
    drained: bool = False
    inflight: int = 0
    remote_inflight: int = 0  # in flight through other gateways (shared state)
    ewma_ms: float = 0.0
    requests: int = 0
    failures: int = 0
    pools: list[Waiters] = field(default_factory=list)  # the pools that use it now (ReplicaRegistry.attach)
    engine: EngineLoad | None = None  # its own load, as last read (least_load pools only)
    engine_error: str = ""  # why the last reading failed
    engine_tried: float = 0.0  # monotonic time of the last attempt to read it
    session: aiohttp.ClientSession | None = None
    conns: UpstreamPool | None = None  # the request path's keep-alive connections (pools/upstream.py)
    scrubber: tuple | None = None  # (headers, auth, pools/answers.Scrubber): the last one made, for reuse
    health_path: str | None = None
    # Context window per model id, as the replica reports it (pools/fit.py; None: not read yet).
    windows: dict[str, int] | None = None
    # Credentials of a URL written `http://user:pw@host/v1`: `url` never holds them (it is shown in
    # /v1/route, /health, logs and state keys); they go upstream as Basic auth on every request
    # (passed per request, so that an edit of the credentials alone takes effect at once).
    auth: aiohttp.BasicAuth | None = None
    # Set while no pool uses it (a policy edit dropped it): called when its last request ends, so
    # a replica busy at the edit still has its connection pool closed (ReplicaRegistry.prune).
    on_idle: Callable[[Replica], None] | None = None

    @property
    def root(self) -> str:
        """The server root: the URL without its trailing /v1."""
        return self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url

    @property
    def load(self) -> int:
        return self.inflight + self.remote_inflight

    def available(self, now: float) -> bool:
        return self.healthy and not self.draining and self.breaker.allows(now)

    @property
    def state(self) -> str:
        if self.drained:
            return "drained"
        if self.draining:
            return "draining"
        if not self.healthy:
            return "unhealthy"
        if self.breaker.state != "closed":
            return "ejected"
        return "healthy"

    def window_for(self, model: str) -> int | None:
        """Its context window for `model` (a server of one model: that model's, whatever its id)."""
        if not self.windows:
            return None
        got = self.windows.get(model)
        if got is None and len(set(self.windows.values())) == 1:
            got = next(iter(self.windows.values()))
        return got

    def observe_latency(self, ms: float) -> None:
        self.ewma_ms = ms if self.ewma_ms == 0.0 else self.ewma_ms + EWMA_ALPHA * (ms - self.ewma_ms)

    def client(self) -> aiohttp.ClientSession:
        if self.session is None or self.session.closed:
            connector = aiohttp.TCPConnector(
                limit=0, keepalive_timeout=60.0, enable_cleanup_closed=False, ttl_dns_cache=300
            )
            self.session = aiohttp.ClientSession(
                connector=connector,
                # We ask for identity; an upstream that compresses anyway is decoded here, so the
                # client gets bytes that match the headers it gets, and usage can be read.
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
                timeout=aiohttp.ClientTimeout(total=None),
                # One session serves every tenant: a Set-Cookie from the upstream must never ride
                # along on another caller's request.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self.session

    def upstream(self) -> UpstreamPool:
        """The request path's client (pools/upstream.py); aiohttp's session (`client`) does the rest."""
        c = self.conns
        if c is None or c.closed:
            c = self.conns = UpstreamPool(self.url)
        return c

    async def aclose(self) -> None:
        if self.conns is not None:
            self.conns.close()
        if self.session is not None and not self.session.closed:
            await self.session.close()

    def snapshot(self) -> dict:
        return {
            "name": self.name,
            "url": self.url,
            "state": self.state,
            "healthy": self.healthy,
            "health_error": self.health_error or None,
            "circuit": self.breaker.state,
            "circuit_error": self.breaker.last_error or None,
            "inflight": self.inflight,
            "remote_inflight": self.remote_inflight,
            "ewma_ms": round(self.ewma_ms, 2),
            "requests": self.requests,
            "failures": self.failures,
            **({"max_model_len": self.windows} if self.windows else {}),
            **({} if self.engine is None and not self.engine_error else {"engine": self.engine_snapshot()}),
        }

    def engine_snapshot(self) -> dict:
        e = self.engine
        out: dict = {"error": self.engine_error or None}
        if e is not None:
            out.update(running=e.running, waiting=e.waiting, kv_usage=e.kv, age_s=round(time.monotonic() - e.at, 3),
                       read_by="another gateway" if e.shared else "this gateway")
        return out


def split_credentials(url: str) -> tuple[str, aiohttp.BasicAuth | None]:
    """The URL without its userinfo, and that userinfo as Basic auth (None when it has none)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=hostport)), aiohttp.BasicAuth(unquote(user), unquote(password))


def public_url(url: str) -> str:
    """A URL as it may be shown: without userinfo, ever."""
    return split_credentials(url)[0]


def default_name(url: str) -> str:
    parts = urlsplit(public_url(url))
    return parts.netloc or public_url(url)


def make_replica(url: str, name: str | None, breaker: CircuitBreaker, health_path: str | None) -> Replica:
    """A replica for a policy's URL: credentials taken out of the URL (and so out of its name)."""
    clean, auth = split_credentials(url)
    return Replica(url=clean, name=name or default_name(clean), breaker=breaker, health_path=health_path, auth=auth)

