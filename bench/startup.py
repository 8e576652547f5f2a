"""How long a process of ours takes to start: a gateway (`switchyard serve`) until /health answers,
and an engine process's imports (`switchyard.engine.serving.rank0`), for one or more source trees,
rounds alternating between the trees; with `--engine MODEL`, an engine until it is ready.

  python bench/startup.py --trees . ../before --runs 8
  python bench/startup.py --trees . ../before --runs 3 --engine smollm2-135m --tp 3

A gateway is started in front of a port nothing listens on, health checks off, and stopped once it
answers; its wall time to ready and the CPU it used (user + system, from wait4) are reported as
medians. What the test suite pays for each process it starts (docs/testing.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import free_port, spawn, wait_http  # noqa: E402

POLICY = """pools:
  small: {{replicas: [{{url: "http://127.0.0.1:{dead}/v1"}}], model: m}}
  large: {{replicas: [{{url: "http://127.0.0.1:{dead}/v1"}}], model: m}}
routes:
  - {{name: all, pool: small}}
"""


def wait4(p: subprocess.Popen) -> float:
    """Reap p; the CPU seconds (user + system) it used."""
    _, _, ru = os.wait4(p.pid, 0)
    p.returncode = 0
    return ru.ru_utime + ru.ru_stime


def to_ready(tree: Path, args: list[str], timeout: float, poll: float) -> tuple[float, float]:
    """`switchyard ARGS --port P` of `tree` until its /health answers 200 (polled finely: the wait
    is the figure), then stopped: (seconds to ready, CPU seconds)."""
    port = free_port()
    t0 = time.perf_counter()
    p = spawn([sys.executable, "-m", "switchyard.cli", *args, "--port", str(port)], None,
              env={"PYTHONPATH": str(tree)}, cwd=tree)
    wait_http(f"http://127.0.0.1:{port}/health", timeout, p, poll=poll)  # an engine answers 503 while it loads
    ready = time.perf_counter() - t0
    p.send_signal(signal.SIGTERM)
    return ready, wait4(p)


def gateway(tree: Path, policy: Path) -> tuple[float, float]:
    return to_ready(tree, ["serve", "--policy", str(policy), "--no-health-checks", "--drain-grace", "0"], 60, 0.005)


def engine_import(tree: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    cpu = wait4(spawn([sys.executable, "-c", "import switchyard.engine.serving.rank0"], None,
                      env={"PYTHONPATH": str(tree)}, cwd=tree))
    return time.perf_counter() - t0, cpu


def engine_ready(tree: Path, model: str, tp: int) -> tuple[float, float]:
    """`switchyard engine serve` (int4, the test suite's settings) until /health answers 200: imports,
    the GGUF's reading, the weights' packing and the warm-up, on every rank."""
    return to_ready(tree, ["engine", "serve", "--model", model, "--tp", str(tp), "--max-model-len", "1024",
                           "--max-num-seqs", "12", "--collective", "ring", "--threads", "1"], 300, 0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="+", default=["."])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--engine", metavar="MODEL", help="also time an engine to ready on this model (a path or "
                    "a registry name, e.g. smollm2-135m): wall time to ready; CPU of the server and the ranks it reaped")
    ap.add_argument("--tp", type=int, default=1)
    a = ap.parse_args()
    trees = [Path(t).resolve() for t in a.trees]
    tmp = Path(tempfile.mkdtemp())
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY.format(dead=free_port()))
    got: dict[tuple[str, Path], list[tuple[float, float]]] = {}
    for r in range(a.runs):
        order = trees if r % 2 == 0 else trees[::-1]
        for t in order:
            got.setdefault(("gateway to /health", t), []).append(gateway(t, policy))
            got.setdefault(("engine imports", t), []).append(engine_import(t))
            if a.engine:
                got.setdefault((f"engine TP={a.tp} to ready", t), []).append(engine_ready(t, a.engine, a.tp))
    for (what, t), v in got.items():
        print(f"{what:20} {str(t):40} wall {statistics.median(x[0] for x in v):.3f} s, "
              f"CPU {statistics.median(x[1] for x in v):.3f} s (medians of {len(v)})")


if __name__ == "__main__":
    main()
