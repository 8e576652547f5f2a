"""A gateway started for the replay: `switchyard serve --policy FILE` on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx


class GatewayStartError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GatewayProcess:
    """Context manager: the gateway runs between enter and exit, and is always stopped."""

    def __init__(self, policy_file: str | Path, start_timeout: float = 60.0, extra_args: list[str] | None = None):
        self.policy_file = Path(policy_file)
        self.start_timeout = start_timeout
        self.extra_args = extra_args or []
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the process)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace").strip()[-1500:]

    def start(self) -> str:
        self.port = free_port()
        cmd = [sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(self.policy_file),
               "--host", "127.0.0.1", "--port", str(self.port), *self.extra_args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ))
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise GatewayStartError(
                    f"the gateway exited with code {self.proc.returncode} before it was ready:\n{self._log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0, trust_env=False).status_code < 500:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise GatewayStartError(f"the gateway was not ready within {self.start_timeout:g}s:\n{self._log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()

    def __enter__(self) -> GatewayProcess:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
