"""`switchyard serve --workers N`: N gateway processes on one port, one view of state.

Each worker is a whole gateway (its own uvicorn server, event loop, policy watcher and health
checks) listening on its own SO_REUSEPORT socket, so the kernel spreads new connections over
them without a shared accept queue. What must be one view across workers (sessions and pins,
in-flight counts, breakers, rate limits, stored responses) lives in Redis: `--redis URL`, or
else a private `redis-server` child the parent starts on a unix socket (no persistence) when
the binary is installed. Without either, each worker has its own state and says so.

The parent only supervises: it restarts no worker unless asked (`--worker-restarts`), forwards
SIGTERM / SIGINT once to every worker (each drains as a single gateway does), and exits 0 when
every worker has exited cleanly. Workers run in their own process group, so a terminal's Ctrl-C
or a `kill -- -PGID` reaches them only through the parent (once), and they get SIGTERM from the
kernel if the parent dies (PR_SET_PDEATHSIG), so none outlives it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("switchyard.workers")

PR_SET_PDEATHSIG = 1
PER_WORKER = ("per worker: sessions, pins, in-flight counts, breakers, rate limits and stored responses are "
              "each worker's own (pass --redis URL, or install redis-server, to share them)")


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker knows of its place; shown in /health (with the admin key)."""

    index: int
    count: int
    state: str  # "redis" (--redis), "local-redis" (the parent's redis-server child) or "per-worker"
    state_url: str | None = None  # the local redis-server's URL, for the state store only (not for keys)

    def describe(self, admitted: int) -> dict[str, Any]:
        note = {"redis": "shared through --redis", "local-redis": "shared through the parent's redis-server child",
                "per-worker": PER_WORKER}[self.state]
        return {"index": self.index, "count": self.count, "pid": os.getpid(), "admitted": admitted,
                "state": self.state, "note": note}


def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """The kernel sends `sig` to this process when its parent exits (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A bound socket in the port's SO_REUSEPORT group (uvicorn listens on it)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(addr)
    sock.set_inheritable(True)
    return sock


def _listening(host: str, port: int) -> bool:
    """Whether a server already accepts connections on host:port (a wildcard address: on loopback)."""
    target = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((target, port), timeout=0.5):
            return True
    except OSError:
        return False


class LocalRedis:
    """A private redis-server for the workers' state: a unix socket in a fresh 0700 folder, no
    persistence, killed with the parent (it holds nothing that outlives the gateway)."""

    def __init__(self, binary: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="switchyard-redis-"))
        self.sock = self.dir / "redis.sock"
        self.url = f"unix://{self.sock}"
        self.p = subprocess.Popen(
            [binary, "--port", "0", "--unixsocket", str(self.sock), "--unixsocketperm", "700", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=(self.dir / "redis.log").open("w"), start_new_session=True,
            preexec_fn=lambda: _die_with_parent(signal.SIGKILL))
        self._wait()

    def _wait(self, timeout: float = 10.0) -> None:
        import redis

        deadline = time.monotonic() + timeout
        while True:
            try:
                redis.Redis(unix_socket_path=str(self.sock), socket_timeout=0.5).ping()
                return
            except (redis.RedisError, OSError):
                if self.p.poll() is not None or time.monotonic() > deadline:
                    err = (self.dir / "redis.log").read_text(errors="replace")[-500:]
                    self.stop()
                    raise RuntimeError(f"the local redis-server did not start: {err}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


class Supervisor:
    """Starts the workers, forwards a stop signal once, restarts up to `restarts` that die."""

    def __init__(self, opts: dict[str, Any], count: int, restarts: int, info: WorkerInfo) -> None:
        self.opts = opts
        self.count = count
        self.restarts_left = restarts
        self.info = info
        self.procs: dict[int, subprocess.Popen] = {}  # index -> process
        self.stopping: int | None = None  # the signal being forwarded

    def _spawn(self, index: int) -> None:
        info = WorkerInfo(index, self.count, self.info.state, self.info.state_url)
        p = subprocess.Popen([sys.executable, "-c", "from switchyard.api.cli import worker_main; worker_main()"],
                             stdin=subprocess.PIPE, process_group=0,
                             preexec_fn=_die_with_parent)
        assert p.stdin is not None
        p.stdin.write(pickle.dumps((self.opts, info)))
        p.stdin.close()
        self.procs[index] = p

    def _signal(self, sig: int, frame: Any) -> None:
        if self.stopping is not None:  # a second signal: pass it on (the workers stop the usual way)
            log.warning("signal %d again: passing it on", sig)
        else:
            log.warning("signal %d: stopping %d workers (each drains)", sig, len(self.procs))
        self.stopping = sig
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(sig)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._signal)
        for i in range(self.count):
            self._spawn(i)
        worst = 0
        while self.procs:
            time.sleep(0.1)
            for i, p in list(self.procs.items()):
                rc = p.poll()
                if rc is None:
                    continue
                del self.procs[i]
                if self.stopping is not None:  # asked to stop: a clean exit is 0, a signal's or an error's not
                    worst = worst or (0 if rc == 0 else rc if rc > 0 else 1)
                    continue
                log.error("worker %d (pid %d) exited with %d", i, p.pid, rc)
                worst = rc if rc > 0 else 1  # one died unasked: the parent's exit says so (1 for a signal)
                if self.restarts_left > 0:
                    self.restarts_left -= 1
                    log.warning("restarting worker %d (%d restarts left)", i, self.restarts_left)
                    self._spawn(i)
                elif self.procs:
                    log.warning("%d workers left serving; not restarting (--worker-restarts)", len(self.procs))
        return worst


def supervise(opts: dict[str, Any], local_redis: bool) -> int:
    """The parent of `serve --workers N`: shared state first, then the workers; their exit code."""
    count, restarts = int(opts["workers"]), int(opts["worker_restarts"])
    if not opts["port"]:
        log.error("--workers needs a port (with --port 0 each worker would pick its own)")
        return 2
    if _listening(opts["host"], opts["port"]):
        # Another process of this user with SO_REUSEPORT would silently share the port with us.
        log.error("cannot listen on %s:%s: something already listens there", opts["host"], opts["port"])
        return 1
    try:
        reuse_port_socket(opts["host"], opts["port"]).close()  # a port already taken says so once, here
    except OSError as e:
        log.error("cannot listen on %s:%s: %s", opts["host"], opts["port"], e.strerror or e)
        return 1
    server: LocalRedis | None = None
    if opts["redis"]:
        info = WorkerInfo(0, count, "redis")
    elif local_redis and (binary := shutil.which("redis-server")):
        server = LocalRedis(binary)
        info = WorkerInfo(0, count, "local-redis", server.url)
        log.warning("%d workers share state through a local redis-server (%s, no persistence)", count, server.url)
    else:
        info = WorkerInfo(0, count, "per-worker")
        log.warning("state is %s", PER_WORKER)
    try:
        rc = Supervisor(opts, count, restarts, info).run()
    finally:
        if server is not None:
            server.stop()
    log.warning("all %d workers exited (%d)", count, rc)
    return rc
