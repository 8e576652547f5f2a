"""API keys: hashed storage, per-key allowed policies/pools, requests- and tokens-per-minute limits.

A key is `sk-sy-` + 43 random URL-safe characters, shown once by `switchyard keys create`;
only its SHA-256 is stored (the key is 256 random bits, so a fast unsalted hash is enough:
there is nothing to brute-force). Stores: a JSON file (one gateway, or several on one host)
or Redis (`<prefix>keys`, a hash of sha256 -> record) when the gateways share a Redis.

On the request path nothing waits on a store: keys are cached in memory and refreshed every
second (a new key is also looked up once on a miss); rate limits count in local windows that
the state sync (state/sync.py) adds up across gateways every tick. The key itself never goes
to a log or a metric label: keys are named by their `name` and `id`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from switchyard.api import errors
from switchyard.state.base import CounterDelta

log = logging.getLogger("switchyard.auth")

KEY_PREFIX = "sk-sy-"
WINDOW = 60.0  # rpm / tpm windows, seconds (fixed windows aligned to the minute)
REFRESH = 1.0  # seconds between key-cache refreshes
DEFAULT_KEYS_FILE = Path(os.environ.get("SWITCHYARD_KEYS_FILE", Path.home() / ".config" / "switchyard" / "keys.json"))


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class KeyRecord:
    id: str
    name: str
    hash: str
    policies: list[str] | None = None  # None: any policy
    pools: list[str] | None = None  # None: any pool
    rpm: int | None = None
    tpm: int | None = None
    created: float = field(default_factory=time.time)
    revoked: float | None = None
    hint: str = ""  # last 4 characters, to tell keys apart in listings (as OpenAI shows them)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> KeyRecord:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def public(self) -> dict:
        d = self.to_json()
        d.pop("hash")
        return d


def make_key(name: str, policies: list[str] | None, pools: list[str] | None, rpm: int | None,
             tpm: int | None) -> tuple[str, KeyRecord]:
    key = new_key()
    return key, KeyRecord(uuid.uuid4().hex[:12], name, hash_key(key), policies, pools, rpm, tpm, hint=key[-4:])


# --- storage --------------------------------------------------------------------------------

class KeyStore(Protocol):
    where: str

    async def load_all(self) -> dict[str, KeyRecord]: ...

    async def lookup(self, digest: str) -> KeyRecord | None: ...

    async def put(self, rec: KeyRecord) -> None: ...

    async def version(self) -> str:
        """Changes whenever a key is added or changed (cheap to ask every second)."""
        ...

    async def aclose(self) -> None: ...


class FileKeyStore:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.where = str(self.path)

    def _read(self) -> dict[str, KeyRecord]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return {d["hash"]: KeyRecord.from_json(d) for d in data.get("keys", [])}

    async def load_all(self) -> dict[str, KeyRecord]:
        return self._read()

    async def lookup(self, digest: str) -> KeyRecord | None:
        return self._read().get(digest)

    async def put(self, rec: KeyRecord) -> None:
        keys = self._read()
        keys[rec.hash] = rec
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # hashes only, still private
        with os.fdopen(fd, "w") as f:
            json.dump({"keys": [r.to_json() for r in keys.values()]}, f, indent=1)
        os.replace(tmp, self.path)  # readers see the old file or the new one

    async def version(self) -> str:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return "none"
        return f"{st.st_mtime_ns}:{st.st_size}"

    async def aclose(self) -> None:
        return None


class RedisKeyStore:
    def __init__(self, url: str, prefix: str = "switchyard:", timeout: float = 0.5):
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # Never on the request path except a first look-up of an unknown key (capped at 0.1 s).
        self.redis = aioredis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                             retry=Retry(NoBackoff(), 0))
        self.hkey = prefix + "keys"
        self.vkey = prefix + "keys:version"
        self.where = f"redis {_redact(url)}"

    async def load_all(self) -> dict[str, KeyRecord]:
        raw = await self.redis.hgetall(self.hkey)
        return {k.decode(): KeyRecord.from_json(json.loads(v)) for k, v in raw.items()}

    async def lookup(self, digest: str) -> KeyRecord | None:
        raw = await self.redis.hget(self.hkey, digest)
        return None if raw is None else KeyRecord.from_json(json.loads(raw))

    async def put(self, rec: KeyRecord) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.hkey, rec.hash, json.dumps(rec.to_json()))
        pipe.incr(self.vkey)
        await pipe.execute()

    async def version(self) -> str:
        v = await self.redis.get(self.vkey)
        return v.decode() if v else "0"

    async def aclose(self) -> None:
        await self.redis.aclose()


def _redact(url: str) -> str:
    return re.sub(r"//[^@/]*@", "//***@", url)


def open_keystore(keys_file: Path | None, redis_url: str | None) -> KeyStore:
    """--keys-file wins; else the shared Redis; else the default file (~/.config/switchyard/keys.json)."""
    if keys_file is not None:
        return FileKeyStore(keys_file)
    if redis_url:
        return RedisKeyStore(redis_url)
    return FileKeyStore(DEFAULT_KEYS_FILE)


# --- rate limits ----------------------------------------------------------------------------

@dataclass(slots=True)
class _Window:
    idx: int  # window number (time // WINDOW)
    shared: int = 0  # total across gateways at the last sync (our synced part included)
    pending: int = 0  # ours since the last sync
    sending: int = 0  # ours, in the sync now in flight


class RateLimiter:
    """Fixed one-minute windows per key and kind (r: requests, t: tokens), summed across gateways."""

    def __init__(self) -> None:
        self._w: dict[tuple[str, str], _Window] = {}

    def _window(self, key_id: str, kind: str, idx: int) -> _Window:
        w = self._w.get((key_id, kind))
        if w is None or w.idx != idx:
            w = _Window(idx)
            self._w[(key_id, kind)] = w
        return w

    def used(self, key_id: str, kind: str, now: float) -> int:
        w = self._w.get((key_id, kind))
        if w is None or w.idx != int(now // WINDOW):
            return 0
        return w.shared + w.pending + w.sending

    def add(self, key_id: str, kind: str, n: int, now: float) -> None:
        self._window(key_id, kind, int(now // WINDOW)).pending += n

    def take_deltas(self) -> tuple[list[CounterDelta], list[str]]:
        idx = int(time.time() // WINDOW)
        out: list[CounterDelta] = []
        for (key_id, kind), w in list(self._w.items()):
            if w.idx < idx - 1:
                del self._w[(key_id, kind)]
                continue
            if w.pending:
                w.sending, w.pending = w.pending, 0
                out.append((f"rl:{w.idx}", f"{key_id}:{kind}", w.sending, int(WINDOW * 2000)))
        # Read back the whole minute: every key's totals, those spent only elsewhere included.
        return out, [f"rl:{idx}"]

    def apply_totals(self, deltas: list[CounterDelta], totals: dict[str, dict[str, int]] | None) -> None:
        if totals is None:  # not shared (memory store or Redis away): ours stay local
            for bucket, fld, _, _ in deltas:
                key_id, kind = fld.rsplit(":", 1)
                w = self._w.get((key_id, kind))
                if w is not None and f"rl:{w.idx}" == bucket:
                    w.pending += w.sending
                    w.sending = 0
            return
        for bucket, fields in totals.items():
            idx = int(bucket.rsplit(":", 1)[1])
            for fld, total in fields.items():
                key_id, kind = fld.rsplit(":", 1)
                w = self._window(key_id, kind, idx)
                w.shared = total
                w.sending = 0
        for _, fld, _, _ in deltas:  # a window that just ended: nothing to read back
            key_id, kind = fld.rsplit(":", 1)
            w = self._w.get((key_id, kind))
            if w is not None:
                w.sending = 0


# --- usage from upstream answers ------------------------------------------------------------

_TOTAL = re.compile(rb'"total_tokens"\s*:\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
TAIL = 4096


def usage_tokens(data: bytes) -> int | None:
    """Total tokens of the last `usage` object in `data` (a body, or the tail of an SSE stream)."""
    i = data.rfind(b'"usage"')
    if i < 0:
        return None
    m = _TOTAL.search(data, i)
    if m:
        return int(m.group(1))
    p, c = _PROMPT.search(data, i), _COMPLETION.search(data, i)
    if p or c:
        return (int(p.group(1)) if p else 0) + (int(c.group(1)) if c else 0)
    return None


class _TapContent:
    """Stands in for aiohttp's StreamReader: passes chunks on, keeps the tail and counts events."""

    __slots__ = ("_content", "tail", "events")

    def __init__(self, content: Any, first: bytes):
        self._content = content
        self.tail = first[-TAIL:]
        self.events = first.count(b"data:")

    async def readany(self) -> bytes:
        b = await self._content.readany()
        if b:
            self.events += b.count(b"data:")
            self.tail = (self.tail + b)[-TAIL:]
        return b


class StreamTap:
    """Wraps an upstream aiohttp response for the SSE relay; read `tokens()` when the stream ended."""

    def __init__(self, upstream: Any, first: bytes, prompt_estimate: int):
        self.content = _TapContent(upstream.content, first)
        self.prompt_estimate = prompt_estimate

    def tokens(self) -> tuple[int, bool]:
        """(tokens, estimated). With no usage in the stream: prompt estimate + one token per event."""
        n = usage_tokens(self.content.tail)
        if n is not None:
            return n, False
        events = max(0, self.content.events - 1)  # the last event is [DONE]
        return self.prompt_estimate + events, True


# --- the gate on the request path -----------------------------------------------------------

def _error(status: int, message: str, type_: str, code: str, headers: dict[str, str] | None = None) -> errors.APIError:
    return errors.APIError(status, message, type_, None, code, headers)


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

    async def authenticate(self, headers: Any) -> KeyRecord:
        value = headers.get("authorization")
        if not value:
            self.m_auth_failures.labels("missing").inc()
            raise _error(401, "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                         "invalid_request_error", "missing_api_key")
        scheme, _, token = value.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            self.m_auth_failures.labels("malformed").inc()
            raise _error(401, "The Authorization header must be 'Bearer KEY'.", "invalid_request_error",
                         "invalid_api_key")
        digest = hash_key(token)
        rec = self._keys.get(digest)
        if rec is None:
            rec = await self._lookup(digest)
        if rec is None:
            self.m_auth_failures.labels("unknown").inc()
            raise _error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        if rec.revoked:
            self.m_auth_failures.labels("revoked").inc()
            raise _error(401, f"This API key ({rec.name}) has been revoked.", "invalid_request_error",
                         "invalid_api_key")
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

    def admit(self, rec: KeyRecord, model: str, policy: str, pool: str, direct: bool) -> None:
        """403 for a policy or pool the key may not use; 429 over its rpm/tpm. Counts the request."""
        if rec.policies is not None and not direct and model not in rec.policies and policy not in rec.policies:
            self.m_requests.labels(rec.name, "forbidden").inc()
            raise _error(403, f"This API key ({rec.name}) may not use policy {policy!r} (model {model!r}); "
                              f"allowed: {', '.join(rec.policies) or 'none'}.", "permission_error",
                         "model_not_allowed")
        if direct and rec.policies is not None and rec.pools is None and model not in rec.policies:
            self.m_requests.labels(rec.name, "forbidden").inc()
            raise _error(403, f"This API key ({rec.name}) may not send requests to pool {pool!r} directly; "
                              f"allowed: {', '.join(rec.policies) or 'none'}.", "permission_error",
                         "model_not_allowed")
        if rec.pools is not None and pool not in rec.pools and model not in rec.pools:
            self.m_requests.labels(rec.name, "forbidden").inc()
            raise _error(403, f"This API key ({rec.name}) may not use pool {pool!r}; "
                              f"allowed: {', '.join(rec.pools) or 'none'}.", "permission_error", "pool_not_allowed")
        now = time.time()
        lim = self.limiter
        if rec.rpm is not None and lim.used(rec.id, "r", now) >= rec.rpm:
            self._over(rec, "requests", "RPM", rec.rpm, lim.used(rec.id, "r", now), now)
        if rec.tpm is not None and lim.used(rec.id, "t", now) >= rec.tpm:
            self._over(rec, "tokens", "TPM", rec.tpm, lim.used(rec.id, "t", now), now)
        lim.add(rec.id, "r", 1, now)
        self.m_requests.labels(rec.name, "admitted").inc()

    def _over(self, rec: KeyRecord, kind: str, abbr: str, limit: int, used: int, now: float) -> None:
        reset = WINDOW - (now % WINDOW)
        self.m_requests.labels(rec.name, f"limited_{kind}").inc()
        headers = {
            "Retry-After": str(max(1, int(reset + 0.999))),
            f"x-ratelimit-limit-{kind}": str(limit),
            f"x-ratelimit-remaining-{kind}": "0",
            f"x-ratelimit-reset-{kind}": f"{reset:.0f}s",
        }
        raise _error(429, f"Rate limit reached for API key {rec.name} on {kind} per min ({abbr}): "
                          f"Limit {limit}, Used {used}. Please try again in {reset:.0f}s.",
                     kind, "rate_limit_exceeded", headers)

    def account(self, rec: KeyRecord, tokens: int, estimated: bool) -> None:
        if tokens <= 0:
            return
        self.limiter.add(rec.id, "t", tokens, time.time())
        self.m_tokens.labels(rec.name, "estimated" if estimated else "usage").inc(tokens)

    def account_body(self, rec: KeyRecord, body: bytes, prompt_estimate: int) -> None:
        n = usage_tokens(body)
        if n is None:
            self.account(rec, prompt_estimate, True)
        else:
            self.account(rec, n, False)

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


def check_admin(headers: Any, admin_key: str) -> bool:
    value = headers.get("authorization") or ""
    scheme, _, token = value.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), admin_key.encode())
