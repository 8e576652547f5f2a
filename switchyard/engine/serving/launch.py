"""Starting a replica: one process per rank.

`engine serve --tp N` becomes a supervisor that starts N rank processes (the same command,
with torchrun's environment variables) and stops all of them when any one dies: a replica
is only as healthy as its weakest rank. Under `torchrun`, each process is already a rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from switchyard.engine.runner.options import EngineOptions

log = logging.getLogger("switchyard.engine.serving.launch")
SUPERVISED_ENV = "SWITCHYARD_SUPERVISED"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Runs in the child before exec: signal it if its parent dies (Linux PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)


def die_with_parent_term() -> None:
    _die_with_parent(signal.SIGTERM)


def supervise(argv: list[str], tp: int, grace_s: float = 3.0) -> int:
    """Start `tp` ranks running `argv` and wait. Exit code 0 only for a requested shutdown."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(tp):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(tp), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(tp), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   **{SUPERVISED_ENV: "1"})
        procs.append(subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=_die_with_parent))
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()
        with contextlib.suppress(ProcessLookupError):
            procs[0].send_signal(signal.SIGTERM)  # rank 0 tells the followers to stop

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            codes = [p.poll() for p in procs]
            dead = [i for i, c in enumerate(codes) if c is not None]
            if not dead:
                time.sleep(0.1)
                continue
            first = dead[0]
            clean = stopping.is_set() and codes[first] == 0
            if not clean:
                log.error("rank %d exited with %s: stopping the replica", first, codes[first])
            # Let rank 0 notice on its own (it fails open requests and reports), then make sure.
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            all_ok = all(p.returncode == 0 for p in procs)
            return 0 if clean and all_ok else 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for p in procs:
            if p.poll() is None:
                p.kill()


def rank_from_env() -> tuple[int, int] | None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def run_rank(opts: EngineOptions, model_name: str, rank: int, world: int, host: str, port: int) -> int:
    """Body of one rank process: rank 0 serves HTTP and schedules, the others follow."""
    from switchyard.engine.runner.model_runner import Runner

    runner = Runner(opts.replace(tp=world), rank, world)
    if rank != 0:
        # Stopping is rank 0's to do: it tells the followers (STOP) once its requests are done.
        # torchrun signals every rank at once; a follower that died on it would leave rank 0 a
        # broken collective to log instead of an orderly shutdown. A follower whose rank 0 is
        # gone still exits: its next collective times out.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            runner.setup()
            code = runner.follow()
        except Exception as e:
            log.error("rank %d: %s: %s", rank, type(e).__name__, e)
            code = 1
        if code == 0:
            runner.shutdown()
        return code
    from switchyard.engine.serving.rank0 import serve_rank0

    return serve_rank0(runner, model_name, host, port)


def serve_argv() -> list[str]:
    """The command line that re-runs this `engine serve` as one rank, through the entry point it
    came in by (`switchyard engine serve` or `python -m switchyard.engine.serving.cli`)."""
    parts = Path(sys.argv[0]).parts
    standalone = parts[-2:] == ("engine", "cli.py") or parts[-3:] == ("engine", "serving", "cli.py")
    return [sys.executable, "-m", "switchyard.engine.serving.cli" if standalone else "switchyard.cli", *sys.argv[1:]]
