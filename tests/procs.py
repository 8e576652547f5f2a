"""Real processes on loopback for tests: start, wait until they answer, stop for sure."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Test gateways serve TLS with a certificate made for the test: on loopback, trust it unseen.
LOOPBACK_TLS = ssl.create_default_context()
LOOPBACK_TLS.check_hostname = False
LOOPBACK_TLS.verify_mode = ssl.CERT_NONE


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout,
                                    context=LOOPBACK_TLS if url.startswith("https:") else None) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_post(url: str, body: bytes, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Proc:
    """A child process that must answer `ready_url` (any status < 500) before tests use it."""

    def __init__(self, cmd: list[str], ready_url: str, log: Path, env: dict | None = None, timeout: float = 30.0,
                 ready: Callable[[int], bool] = lambda status: status < 500, cwd: Path | None = None):
        self.cmd = cmd
        self.log = log
        self._signalled = False
        self._logf = log.open("w")
        self.p = subprocess.Popen(cmd, stdout=self._logf, stderr=subprocess.STDOUT, cwd=cwd or ROOT,
                                  env={**os.environ, **(env or {})}, start_new_session=True)
        deadline = time.time() + timeout
        while True:
            if self.p.poll() is not None:
                raise RuntimeError(f"{cmd} exited with {self.p.returncode}:\n{self.output()}")
            try:
                status, _ = http_get(ready_url, timeout=1.0)
                if ready(status):
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"{cmd} did not answer {ready_url} in {timeout}s:\n{self.output()}")
            time.sleep(0.02)  # a start-up is ~0.5 s here: poll often enough not to add a tenth to it

    def output(self) -> str:
        self._logf.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(5)

    def terminate(self, group: bool = True) -> None:
        """SIGTERM alone, not waiting (stop_all signals many, then waits for them together)."""
        if self.p.poll() is None and not self._signalled:
            self._signalled = True  # once: a second SIGTERM would cut a gateway's drain short
            try:
                if group:
                    os.killpg(self.p.pid, signal.SIGTERM)
                else:
                    self.p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, group: bool = True, wait: float = 10.0) -> None:
        """SIGTERM (to the process group, or to the process alone so that it stops its own
        children), then SIGKILL to the group after `wait` seconds."""
        if self.p.poll() is None:
            try:
                self.terminate(group)
                self.p.wait(wait)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait(5)
        self._logf.close()


def stop_all(procs: Iterable[Proc | None]) -> None:
    """Stop many processes at once: each gets SIGTERM first, then each is waited for (a gateway's
    drain and an upstream's shutdown overlap instead of adding up)."""
    live = [p for p in procs if p is not None]
    for p in live:
        p.terminate()
    for p in live:
        p.stop()


def on_free_port(start: Callable[[int], Proc], tries: int = 3) -> tuple[Proc, int]:
    """start(port) on a free port; a free port can be taken by another test's process before the server
    binds it, and then it starts again on another (up to `tries` ports)."""
    for attempt in range(tries):
        port = free_port()
        try:
            return start(port), port
        except RuntimeError as e:
            if "address already in use" not in str(e) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def start_upstream(tmp: Path, name: str, port: int | None = None, *extra: str) -> tuple[Proc, str]:
    def start(port: int) -> Proc:
        return Proc([sys.executable, str(ROOT / "tests" / "fake_upstream.py"), "--port", str(port), "--name", name,
                     *extra], f"http://127.0.0.1:{port}/health", tmp / f"upstream-{name}.log")

    proc, port = (start(port), port) if port else on_free_port(start)
    return proc, f"http://127.0.0.1:{port}"


def start_gateway(tmp: Path, policies: list[Path], *extra: str, name: str = "gw",
                  env: dict | None = None, cwd: Path | None = None) -> tuple[Proc, str]:
    """`cwd`: run the gateway of another source tree (a worktree of an older commit)."""
    scheme = "https" if "--ssl-certfile" in extra else "http"
    args = [a for p in policies for a in ("--policy", str(p))]

    def start(port: int) -> Proc:
        cmd = [sys.executable, "-m", "switchyard.cli", "serve", "--port", str(port), "--log-level", "info", *args]
        return Proc([*cmd, *extra], f"{scheme}://127.0.0.1:{port}/health", tmp / f"{name}.log", env=env, cwd=cwd)

    proc, port = on_free_port(start)
    return proc, f"{scheme}://127.0.0.1:{port}"
