from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from replay_helpers import wait_http, write_answers  # noqa: E402

from switchyard.replay.cases import Case  # noqa: E402
from switchyard.replay.gateway import free_port  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start test upstream servers: upstream(cases, wrong_every=0) -> base URL (ending /v1)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(cases: list[Case], wrong_every: int = 0, delay: float = 0.0, fail_first: int = 0) -> str:
        port = free_port()
        answers = write_answers(cases, tmp_path / f"answers-{port}.json")
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "replay_upstream.py"), "--port", str(port), "--answers", str(answers),
             "--wrong-every", str(wrong_every), "--delay", str(delay), "--fail-first", str(fail_first)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        return f"http://127.0.0.1:{port}/v1"

    yield start
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
