"""API keys: the key format, hashed storage, per-key allowed policies/pools and limits.

A key is `sk-sy-` + 43 random URL-safe characters, shown once by `switchyard keys create`;
only its SHA-256 is stored (the key is 256 random bits, so a fast unsalted hash is enough:
there is nothing to brute-force). Stores: a JSON file (one gateway, or several on one host)
or Redis (`<prefix>keys`, a hash of sha256 -> record) when the gateways share a Redis.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

KEY_PREFIX = "sk-sy-"
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
    """Keys in a JSON file, parsed once and again only when the file changes (its mtime and size):
    a never-seen key costs a stat, not a parse of every key (5,000 keys: a parse per 401 took 401s
    from ~2,000/s to ~27/s). The parse runs in a thread, off the event loop."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.where = str(self.path)
        self._cached: dict[str, KeyRecord] = {}
        self._cached_version: str | None = None
        self._loading: asyncio.Future[None] | None = None

    def _read(self) -> dict[str, KeyRecord]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return {d["hash"]: KeyRecord.from_json(d) for d in data.get("keys", [])}

    def _stat_version(self) -> str:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return "none"
        return f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}"

    async def _current(self) -> dict[str, KeyRecord]:
        v = self._stat_version()
        if v != self._cached_version:
            # One parse however many misses arrive at once; shielded, so that a caller's deadline
            # (auth waits 0.1 s) never throws a parse away to start it again on the next miss.
            if self._loading is None or self._loading.done():
                self._loading = asyncio.ensure_future(self._load(v))
            await asyncio.shield(self._loading)
        return self._cached

    async def _load(self, version: str) -> None:
        self._cached = await asyncio.to_thread(self._read)
        self._cached_version = version

    async def load_all(self) -> dict[str, KeyRecord]:
        return dict(await self._current())

    async def lookup(self, digest: str) -> KeyRecord | None:
        return (await self._current()).get(digest)

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
        return f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}"

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
