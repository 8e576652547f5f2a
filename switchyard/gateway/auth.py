"""The gate on the request path: API keys checked against what they may use and their limits.

On the request path nothing waits on a store: keys are cached in memory and refreshed every
second (a new key is also looked up once on a miss); rate limits count in local windows that
the state sync (pools/sync.py) adds up across gateways every tick. The key itself never goes
to a log or a metric label: keys are named by their `name` and `id`. Keys and their stores:
keys.py; the counting: limits.py.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Mapping
from typing import NoReturn

from prometheus_client import CollectorRegistry, Counter

from switchyard.errors import Forbidden, RateLimited, Unauthorized
from switchyard.gateway.keys import KeyRecord, KeyStore, hash_key
from switchyard.gateway.limits import WINDOW, RateLimiter

log = logging.getLogger("switchyard.gateway.auth")

REFRESH = 1.0  # seconds between key-cache refreshes


class Auth:
    def __init__(self, store: KeyStore, registry: CollectorRegistry | None = None):
        self.store = store
        self.limiter = RateLimiter()
        self._keys: dict[str, KeyRecord] = {}
        self._missed: dict[str, float] = {}  # digest -> when a lookup found nothing (one lookup per second)
        self._version = ""
        self._task: asyncio.Task | None = None
        self.error = ""
        reg = registry or CollectorRegistry()
        self.m_requests = Counter("switchyard_key_requests", "Requests by API key name and outcome",
                                  ["key", "outcome"], registry=reg)
        self.m_tokens = Counter("switchyard_key_tokens", "Tokens by API key name; source: usage | estimated",
                                ["key", "source"], registry=reg)
        self.m_auth_failures = Counter("switchyard_auth_failures", "Requests refused by auth", ["reason"],
                                       registry=reg)

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._refresh_loop(), name="keys-refresh")

    async def refresh(self) -> None:
        try:
            v = await self.store.version()
            if v != self._version:
                self._keys = await self.store.load_all()
                self._version = v
                self._missed.clear()
            self.error = ""
        except Exception as e:  # the store is away: keep the keys we know
            self.error = f"{type(e).__name__}: {e}"[:200]

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH)
            await self.refresh()

    def describe(self) -> dict:
        return {"enabled": True, "store": self.store.where, "keys": sum(1 for k in self._keys.values() if not k.revoked),
                **({"error": self.error} if self.error else {})}

    async def authenticate(self, headers: Mapping[str, str]) -> KeyRecord:
        value = headers.get("authorization")
        if not value:
            self.m_auth_failures.labels("missing").inc()
            raise Unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                               code="missing_api_key")
        scheme, _, token = value.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            self.m_auth_failures.labels("malformed").inc()
            raise Unauthorized("The Authorization header must be 'Bearer KEY'.")
        digest = hash_key(token)
        rec = self._keys.get(digest)
        if rec is None:
            rec = await self._lookup(digest)
        if rec is None:
            self.m_auth_failures.labels("unknown").inc()
            raise Unauthorized("Incorrect API key provided.")
        if rec.revoked:
            self.m_auth_failures.labels("revoked").inc()
            raise Unauthorized(f"This API key ({rec.name}) has been revoked.")
        return rec

    async def _lookup(self, digest: str) -> KeyRecord | None:
        """A key created a moment ago: look it up once (at most once a second per unknown key)."""
        now = time.monotonic()
        if now - self._missed.get(digest, -REFRESH) < REFRESH:
            return None
        if len(self._missed) > 10_000:
            self._missed.clear()
        self._missed[digest] = now
        try:
            rec = await asyncio.wait_for(self.store.lookup(digest), 0.1)
        except Exception:
            return None
        if rec is not None:
            self._keys = {**self._keys, digest: rec}
            self._missed.pop(digest, None)
        return rec

    def check(self, rec: KeyRecord, model: str, policy: str, pool: str, direct: bool) -> None:
        """Forbidden for a policy or pool the key may not use."""
        if rec.policies is not None and not direct and model not in rec.policies and policy not in rec.policies:
            self.m_requests.labels(rec.name, "forbidden").inc()
            raise Forbidden(f"This API key ({rec.name}) may not use policy {policy!r} (model {model!r}); "
                            f"allowed: {', '.join(rec.policies) or 'none'}.", code="model_not_allowed")
        if direct and rec.policies is not None and rec.pools is None and model not in rec.policies:
            self.m_requests.labels(rec.name, "forbidden").inc()
            raise Forbidden(f"This API key ({rec.name}) may not send requests to pool {pool!r} directly; "
                            f"allowed: {', '.join(rec.policies) or 'none'}.", code="model_not_allowed")
        if rec.pools is not None and pool not in rec.pools and model not in rec.pools:
            self.m_requests.labels(rec.name, "forbidden").inc()
            raise Forbidden(f"This API key ({rec.name}) may not use pool {pool!r}; "
                            f"allowed: {', '.join(rec.pools) or 'none'}.", code="pool_not_allowed")

    def admit(self, rec: KeyRecord, model: str, policy: str, pool: str, direct: bool) -> None:
        """Forbidden for a policy or pool the key may not use; RateLimited over its rpm/tpm.
        Counts the request."""
        self.check(rec, model, policy, pool, direct)
        now = time.time()
        lim = self.limiter
        if rec.rpm is not None and lim.used(rec.id, "r", now) >= rec.rpm:
            self._over(rec, "requests", "RPM", rec.rpm, lim.used(rec.id, "r", now), now)
        if rec.tpm is not None and lim.used(rec.id, "t", now) >= rec.tpm:
            self._over(rec, "tokens", "TPM", rec.tpm, lim.used(rec.id, "t", now), now)
        lim.add(rec.id, "r", 1, now)
        self.m_requests.labels(rec.name, "admitted").inc()

    def _over(self, rec: KeyRecord, kind: str, abbr: str, limit: int, used: int, now: float) -> NoReturn:
        reset = WINDOW - (now % WINDOW)
        self.m_requests.labels(rec.name, f"limited_{kind}").inc()
        raise RateLimited(f"Rate limit reached for API key {rec.name} on {kind} per min ({abbr}): "
                          f"Limit {limit}, Used {used}. Please try again in {reset:.0f}s.", kind, limit, reset)

    def account(self, rec: KeyRecord, tokens: int, estimated: bool) -> None:
        if tokens <= 0:
            return
        self.limiter.add(rec.id, "t", tokens, time.time())
        self.m_tokens.labels(rec.name, "estimated" if estimated else "usage").inc(tokens)

    def records(self) -> list[KeyRecord]:
        return list(self._keys.values())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        await self.store.aclose()


def check_admin(headers: Mapping[str, str], admin_key: str) -> bool:
    value = headers.get("authorization") or ""
    scheme, _, token = value.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), admin_key.encode())
