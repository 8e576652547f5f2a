"""Helpers of the shared-state tests: redis-server processes, the policy, clients, waits.

(A module of its own name, not conftest, so that importing it never picks another folder's conftest.)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest
import redis
from procs import Proc, free_port, http_get, http_post, start_gateway

REDIS_BIN = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)

POLICY = """
version: 1
name: shared
pools:
  small:
    model: small-model
    max_inflight_per_replica: 64
    health: {{interval: 0.5s, timeout: 0.5s}}
    replicas:
      - {{url: {s0}/v1, name: s0}}
      - {{url: {s1}/v1, name: s1}}
  large:
    model: large-model
    health: {{interval: 0.5s, timeout: 0.5s}}
    replicas:
      - {{url: {l0}/v1, name: l0}}
  bal:
    model: bal-model
    max_inflight_per_replica: 64
    health: {{interval: 0.5s, timeout: 0.5s}}
    replicas:
{bal}
  eject:
    model: eject-model
    retries: 1
    circuit: {{failures: 2, cooldown: 20s}}
    health: {{interval: 0.5s, timeout: 0.5s}}
    replicas:
      - {{url: {e0}/v1, name: e0}}
      - {{url: {e1}/v1, name: e1}}
session:
  pin: pool
  ttl: 10m
routes:
  - name: keyword
    when: {{text: "(?i)hard problem"}}
    pool: large
  - name: default
    pool: small
"""


def need_redis() -> str:
    if REDIS_BIN is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed: the shared-state tests must run under CI (apt install redis-server)")
        pytest.skip("redis-server is not installed")
    return REDIS_BIN


class RedisServer:
    def __init__(self, tmp: Path, port: int | None = None):
        self.bin = need_redis()
        self.port = port or free_port()
        self.tmp = tmp
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.p: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        log = (self.tmp / f"redis-{self.port}.log").open("a")
        self.p = subprocess.Popen([self.bin, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", str(self.tmp)],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=0.5).ping()
                return
            except redis.ConnectionError:
                if self.p.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)

    def kill(self) -> None:
        if self.p is not None and self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(5)

    def stop(self) -> None:
        self.kill()


@dataclass
class Shared:
    tmp: Path
    redis: RedisServer
    ups: dict[str, tuple[Proc, str]]
    policy_a: Path  # pool bal: b0 only
    policy_b: Path  # pool bal: b0 and b1
    a: Proc
    a_url: str
    b: Proc
    b_url: str

    def control(self, name: str, **settings) -> None:
        status, _ = http_post(self.ups[name][1] + "/_control", orjson.dumps(settings))
        assert status == 200

    def served(self, name: str) -> int:
        return orjson.loads(http_get(self.ups[name][1] + "/_state")[1])["served"]

    def gateway(self, *extra: str, name: str, policy: Path | None = None) -> tuple[Proc, str]:
        return start_gateway(self.tmp, [policy or self.policy_b], "--redis", self.redis.url, *extra, name=name)


def write_policies(tmp: Path, ups: dict[str, tuple[Proc, str]]) -> tuple[Path, Path]:
    urls = {k: v[1] for k, v in ups.items()}
    one = f"      - {{url: {urls['b0']}/v1, name: b0}}"
    two = one + f"\n      - {{url: {urls['b1']}/v1, name: b1}}"
    pa, pb = tmp / "a" / "shared.yaml", tmp / "b" / "shared.yaml"
    for path, bal in ((pa, one), (pb, two)):
        path.parent.mkdir(exist_ok=True)
        path.write_text(POLICY.format(bal=bal, **urls))
    return pa, pb


def chat(text: str = "hello", model: str = "auto", stream: bool = False, **extra) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": text}], "stream": stream, **extra})


async def post_many(url: str, bodies: list[bytes], headers: dict | None = None,
                    timeout: float = 30) -> list[tuple[int, dict, bytes]]:
    """Send all at once; (status, headers, body) each; a connection failure is status -1."""
    h = {"Content-Type": "application/json", **(headers or {})}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        async def one(b: bytes) -> tuple[int, dict, bytes]:
            try:
                async with s.post(url + "/v1/chat/completions", data=b, headers=h) as r:
                    return r.status, dict(r.headers), await r.read()
            except (aiohttp.ClientError, OSError) as e:
                return -1, {}, repr(e).encode()

        return await asyncio.gather(*(one(b) for b in bodies))


ADMIN_KEY = "adm-secret"  # the shared gateways' admin key (conftest.py): /health details need it


def health(url: str, admin_key: str = ADMIN_KEY) -> dict:
    req = urllib.request.Request(url + "/health", headers={"Authorization": f"Bearer {admin_key}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return orjson.loads(r.read())


def replica(url: str, name: str) -> dict:
    for pol in health(url)["policies"].values():
        for pool in pol["pools"].values():
            for r in pool["replicas"]:
                if r["name"] == name:
                    return r
    raise KeyError(name)


def wait_for(cond, timeout: float = 5.0, every: float = 0.05, what: str = "condition"):
    deadline = time.time() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)
