"""`switchyard plan` end to end, as a user runs it: a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from cluster_helpers import ROOT


def _plan(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "switchyard.cli", "plan", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_reference_plan_prints_the_figures_simulates_plots_and_emits(tmp_path):
    png, out = tmp_path / "cap.png", tmp_path / "emit"
    res = _plan(
        "--cluster", "deploy/clusters/spark8.yaml", "--policy", "policies/spark8.yaml",
        "--simulate", "--requests", "20000", "--plot", str(png), "--emit", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "f = 0.5: routed 12 req/s = 1.5x the baseline" in res.stdout
    assert "f = 0.25: routed 24 req/s = 3.0x the baseline" in res.stdout
    assert "large-2  spark-5" in res.stdout and "small-1  spark-8" in res.stdout
    sat = next(line for line in res.stdout.splitlines() if "saturation" in line)
    gap = float(sat.rsplit("(", 1)[1].rstrip("%)"))
    assert abs(gap) < 5, sat
    assert "p99" in res.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    leader = (out / "nodes" / "node-spark-1.sh").read_text().replace("\\\n    ", "")
    assert "ray start --head" in leader and "exec vllm serve Qwen/Qwen3-235B-A22B-GPTQ-Int4" in leader
    assert yaml.safe_load((out / "compose" / "docker-compose.yaml").read_text())["services"]["large-0-n0"]


def test_shares_and_large_pool_are_options():
    res = _plan("-c", "deploy/clusters/spark8.yaml", "-p", "policies/spark8.yaml", "-f", "0.1", "--large", "large")
    assert res.returncode == 0, res.stderr
    assert "f = 0.1: routed 44.44 req/s = 5.56x the baseline (bottleneck: small pool)" in res.stdout


def test_refusals_exit_1_with_the_reason(tmp_path):
    ring = tmp_path / "ring8.yaml"
    ring.write_text(
        "fabric: ring\nnodes:\n" + "".join(f"  - {{name: r{i}, address: 10.9.0.{i}}}\n" for i in range(8))
    )
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "pools:\n  large: {model: m, replicas: 2, nodes_per_replica: 4, rate: 1}\n"
        "routes:\n  - {name: d, pool: large}\n"
    )
    res = _plan("--cluster", str(ring), "--policy", str(policy))
    assert res.returncode == 1
    assert "cannot place this policy on this cluster" in res.stderr and "Use `fabric: switch`" in res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("fabric: switch\nnodes:\n  - {name: a, adress: x}\n")
    res = _plan("--cluster", str(bad), "--policy", str(policy))
    assert res.returncode == 1 and f"{bad}:3:" in res.stderr and "unknown key 'adress'" in res.stderr
    res = _plan("--cluster", "deploy/clusters/spark8.yaml", "--policy", "policies/spark8.yaml", "-f", "1.5")
    assert res.returncode == 1 and "between 0 and 1" in res.stderr
