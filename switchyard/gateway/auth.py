"""The gate on the request path: API keys checked against what they may use and their limits.

On the request path nothing waits on a store: keys are cached in memory and refreshed every
second (a new key is also looked up once on a miss); rate limits count in local windows that
the state sync (pools/sync.py) adds up across gateways every tick. The key itself never goes
to a log or a metric label: keys are named by their `name` and `id`. Keys and their stores:
keys.py; the counting: limits.py.

The order on the request path: authenticate; resolve `model` within the key's own policies
(`resolve_for`: a pool name or upstream id another policy also has never escapes into that
policy); `admit` the key (policy permission, rpm, tpm with a token reservation) before any
classifier call or session write; route; `check_pool` the pool routing chose; `settle` the
reservation when the request ends, however it ends.
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
from switchyard.gateway.gateway import Gateway, Target
from switchyard.gateway.keys import KeyRecord, KeyStore, hash_key
from switchyard.gateway.limits import WINDOW, RateLimiter, Reservation

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

    def check_policy(self, rec: KeyRecord, model: str, policy: str, direct: bool) -> None:
        """Forbidden for a policy the key may not use: the policy a direct model belongs to too
        (a key limited to `cheap` is never served by `premium`'s pools)."""
        if rec.policies is None:
            return
        if policy not in rec.policies and (direct or model not in rec.policies):
            self.m_requests.labels(rec.name, "forbidden").inc()
            raise Forbidden(f"This API key ({rec.name}) may not use policy {policy!r} (model {model!r}); "
                            f"allowed: {', '.join(rec.policies) or 'none'}.", code="model_not_allowed")
        if direct and rec.pools is None and model not in rec.policies:
            self.m_requests.labels(rec.name, "forbidden").inc()
            raise Forbidden(f"This API key ({rec.name}) may not send requests to pools directly (model "
                            f"{model!r}); allowed: {', '.join(rec.policies) or 'none'}.", code="model_not_allowed")

    def check_pool(self, rec: KeyRecord, model: str, pool: str) -> None:
        """Forbidden for a pool the key may not use."""
        if rec.pools is not None and pool not in rec.pools and model not in rec.pools:
            self.m_requests.labels(rec.name, "forbidden").inc()
            raise Forbidden(f"This API key ({rec.name}) may not use pool {pool!r}; "
                            f"allowed: {', '.join(rec.pools) or 'none'}.", code="pool_not_allowed")

    def check(self, rec: KeyRecord, model: str, policy: str, pool: str, direct: bool) -> None:
        """Forbidden for a policy or pool the key may not use."""
        self.check_policy(rec, model, policy, direct)
        self.check_pool(rec, model, pool)

    def admit_key(self, rec: KeyRecord, model: str, target: Target, reserve: int = 0) -> Reservation | None:
        """Before routing: Forbidden for a policy (or a direct pool) the key may not use, RateLimited
        over its rpm or tpm. Counts the request and reserves `reserve` tokens (returned: settle it
        when the request ends). Over the tpm once the window is spent, as before; and while other
        requests of the key are in flight, also when this one's reservation would not fit in what
        is left, so concurrent streams cannot spend many times the limit (requests one after
        another still run until the window is spent)."""
        direct = target.pool is not None
        self.check_policy(rec, model, target.policy.name, direct)
        if direct:
            assert target.pool is not None
            self.check_pool(rec, model, target.pool)
        now = time.time()
        lim = self.limiter
        if rec.rpm is not None and lim.used(rec.id, "r", now) >= rec.rpm:
            self._over(rec, "requests", "RPM", rec.rpm, lim.used(rec.id, "r", now), now)
        res = None
        if rec.tpm is not None:
            used = lim.used(rec.id, "t", now)
            if used >= rec.tpm or (lim.outstanding(rec.id) > 0 and used + reserve > rec.tpm):
                self._over(rec, "tokens", "TPM", rec.tpm, used, now)
            if reserve > 0:  # nothing to hold for a dry run (/v1/route, count_tokens)
                res = lim.reserve(rec.id, reserve, now)
        lim.add(rec.id, "r", 1, now)
        self.m_requests.labels(rec.name, "admitted").inc()
        return res

    def settle(self, rec: KeyRecord, res: Reservation | None, tokens: int, estimated: bool) -> None:
        """A request ended: `tokens` it spent (usage, or an estimate) replace its reservation."""
        if res is None:
            self.account(rec, tokens, estimated)
            return
        self.limiter.settle(res, max(0, tokens), time.time())
        if tokens > 0:
            self.m_tokens.labels(rec.name, "estimated" if estimated else "usage").inc(tokens)

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


def resolve_for(gateway: Gateway, model: str, rec: KeyRecord | None) -> Target | None:
    """What `model` names for this key: looked up within the key's own policies first (in the
    gateway's order: policy names, then pool names, then upstream ids, preferring pools the key
    may use), so `model: small` from a key limited to `cheap` is `cheap`'s small even when
    `premium`, loaded first, has one too. Not found there: the gateway's own answer, which the
    permission check then refuses (403) when it lies in another policy."""
    if rec is None or rec.policies is None:
        return gateway.resolve(model)
    allowed = [lp for lp in gateway.policies() if lp.name in rec.policies]
    if model == "auto" and allowed:
        return Target(allowed[0])
    for lp in allowed:
        if lp.name == model:
            return Target(lp)
    for lp in allowed:
        if model in lp.pools:
            return Target(lp, model)
    for usable in (True, False):
        for lp in allowed:
            for name, pool in lp.pools.items():
                if usable and rec.pools is not None and name not in rec.pools:
                    continue
                if pool.model == model:
                    return Target(lp, name)
    return gateway.resolve(model)


def may_use(rec: KeyRecord | None, policy: str, pool: str | None) -> bool:
    """Whether the key may send requests that name this policy (pool None) or this pool of it:
    what /v1/models lists for it."""
    if rec is None:
        return True
    if rec.policies is not None and policy not in rec.policies:
        return False
    if pool is None:
        return True
    if rec.pools is not None:
        return pool in rec.pools
    return rec.policies is None  # a key limited to policies is routed by them, never sent to pools directly


def check_admin(headers: Mapping[str, str], admin_key: str) -> bool:
    value = headers.get("authorization") or ""
    scheme, _, token = value.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), admin_key.encode())
