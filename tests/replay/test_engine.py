"""Live replay through the gateway to our engine serving the real SmolLM2-135M weights.

Whatever the model scores, the report must be complete and consistent. Slow on a shared
2-core machine (CPU decoding), so marked slow (and engine, by its fixture) and kept to two cases and a
few tokens; the engine is the session's shared one (tests/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replay_helpers import policy_file
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.replay.gateway import GatewayProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def engine_url(smollm2_server) -> str:
    """The session's shared engine serving SmolLM2 (tests/conftest.py)."""
    return smollm2_server.url + "/v1"


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
