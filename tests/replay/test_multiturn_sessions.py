"""Agent sessions through the real gateway: `switchyard replay bfcl:multi_turn_*` against a gateway
whose large pool is the sessions reference pool (`switchyard reference-pool bfcl:multi_turn_...`, a
real process) and, in the slow test, whose small pool is our engine serving SmolLM2-135M. The
records show each request's pool, turn by turn; BFCL's own checker agrees with every verdict."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from multiturn_helpers import BfclChecker
from replay_helpers import wait_http
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.datasets import bfcl_zip
from switchyard.replay.bfcl import default_data
from switchyard.replay.gateway import GatewayProcess, free_port
from switchyard.replay.multiturn.run import load_records

ROOT = Path(__file__).resolve().parents[2]
CASES = ["multi_turn_base_100", "multi_turn_base_104"]  # TradingBot only: ~3k tokens of tools, 2 turns
SOURCE = "bfcl:multi_turn_base"


def _policy(path: Path, small: str, large: str, small_model: str = "small-model") -> Path:
    # Turn 0 on small, later turns on large: per-turn routing a session must show in its records.
    path.write_text(f"""version: 1
pools:
  small: {{model: {small_model}, retries: 0, replicas: [{{url: "{small}"}}]}}
  large: {{model: large-model, retries: 0, replicas: [{{url: "{large}"}}]}}
routes:
  - name: later-turns
    when: {{turns: ">= 2"}}
    pool: large
  - name: first-turn
    pool: small
""", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "switchyard.cli", "reference-pool", f"{SOURCE}:110",
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, timeout=60)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def bfcl(tmp_path_factory: pytest.TempPathFactory) -> BfclChecker:
    return BfclChecker(bfcl_zip(), tmp_path_factory.mktemp("bfcl_wheel"))


def _agree(bfcl: BfclChecker, records: list) -> None:
    entries = {e["id"]: e for e in default_data().entries("multi_turn_base")[0]}
    answers = default_data().entries("multi_turn_base")[1]
    for r in records:
        theirs = bfcl.verdict(entries[r.id], answers[r.id], r)
        assert r.verdict["valid"] == theirs["valid"], (r.id, r.verdict, theirs)


def test_sessions_through_the_gateway_to_the_reference_pool(reference: str, bfcl: BfclChecker, tmp_path: Path) -> None:
    pol = _policy(tmp_path / "ref.yaml", reference, reference)  # both pools: the ground truth
    with GatewayProcess(pol) as gw:
        res = CliRunner().invoke(app, ["replay", f"{SOURCE}:3", "--gateway", gw.url, "-p", str(pol),
                                       "--out", str(tmp_path / "o")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    records = load_records(tmp_path / "o" / "sessions.jsonl")
    assert [r.id for r in records] == [f"multi_turn_base_{i}" for i in range(3)]
    for r in records:
        assert r.verdict["valid"] and all(r.verdict["turns"]), r.verdict  # the upper bound
        assert r.session_id.endswith("/" + r.id)
        for k, turn in enumerate(r.turns):
            want = "small" if k == 0 else "large"
            assert {s.pool for s in turn.steps} == {want}, (r.id, k, [s.pool for s in turn.steps])
            assert {s.served_by for s in turn.steps} == {"reference (upper bound)"}
            assert len(turn.steps) == (2 if turn.steps[0].calls else 1)  # calls, then "Done."
    summary = json.loads((tmp_path / "o" / "sessions_summary.json").read_text())[0]
    assert summary["solve_rate"] == 100.0 and summary["solved"] == 3
    turns = sum(len(r.turns) for r in records)
    assert summary["large_turn_share"] == round((turns - 3) / turns, 4)
    _agree(bfcl, records)


@pytest.mark.slow
def test_sessions_with_smollm2_small_and_reference_large(reference: str, bfcl: BfclChecker, tmp_path: Path,
                                                         smollm2_server) -> None:
    """SmolLM2 is the session's shared engine (tests/conftest.py: `engine` by its fixture)."""
    pol = _policy(tmp_path / "mixed.yaml", f"{smollm2_server.url}/v1", reference, "smollm2-135m")
    t0 = time.perf_counter()
    with GatewayProcess(pol) as gw:
        res = CliRunner().invoke(app, ["replay", f"{SOURCE}:ids=100,104", "--gateway", gw.url, "-p", str(pol),
                                       "--max-tokens", "48", "--max-steps", "2", "--timeout", "300",
                                       "--concurrency", "2", "--out", str(tmp_path / "o")],
                                 env={"COLUMNS": "200"})
    wall = time.perf_counter() - t0
    assert res.exit_code == 0, res.output
    records = load_records(tmp_path / "o" / "sessions.jsonl")
    assert sorted(r.id for r in records) == CASES
    for r in records:
        assert r.error is None, r.error
        # Turn 0 went to SmolLM2, turn 1 to the reference: visible per request.
        assert {(s.pool, s.served_by) for s in r.turns[0].steps} == {("small", "smollm2-135m")}, r.turns[0]
        if len(r.turns) > 1:
            assert {(s.pool, s.served_by) for s in r.turns[1].steps} == {("large", "reference (upper bound)")}
        assert isinstance(r.verdict["valid"], bool)
    _agree(bfcl, records)
    steps = [(s.pool, s.served_by) for r in records for t in r.turns for s in t.steps]
    print(f"2 sessions, SmolLM2 small + reference large: {[r.verdict for r in records]}, {steps}, {wall:.0f} s")
