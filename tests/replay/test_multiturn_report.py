"""The sessions report from per-turn outcomes collected through a real gateway: small = a test
upstream that only echoes (it passes only the turns whose ground truth has no call), large = the
sessions reference pool process; routers from the shipped default policy's classifier, the
escalation signals, random and the oracle; report.md/html/json and the plot written."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from replay_helpers import wait_http
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.replay.gateway import GatewayProcess, free_port
from switchyard.replay.multiturn.outcomes import load_turn_outcomes

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["bfcl:multi_turn_base:3", "bfcl:multi_turn_miss_param:3"]


@pytest.fixture
def pools() -> Iterator[tuple[str, str]]:
    ref_port, echo_port = free_port(), free_port()
    procs = [
        subprocess.Popen([sys.executable, "-m", "switchyard.cli", "reference-pool", *SOURCES, "--port", str(ref_port)],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_upstream.py"), "--port", str(echo_port),
                          "--name", "echo"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    try:
        wait_http(f"http://127.0.0.1:{ref_port}/health", procs[0], timeout=60)
        wait_http(f"http://127.0.0.1:{echo_port}/health", procs[1], timeout=30)
        yield f"http://127.0.0.1:{echo_port}/v1", f"http://127.0.0.1:{ref_port}/v1"
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def test_sessions_report_from_per_turn_outcomes(pools: tuple[str, str], tmp_path: Path) -> None:
    small, large = pools
    pol = tmp_path / "p.yaml"
    pol.write_text(f"""version: 1
pools:
  small: {{model: echo, retries: 0, replicas: [{{url: "{small}"}}]}}
  large: {{model: ref, retries: 0, replicas: [{{url: "{large}"}}]}}
routes:
  - name: default
    pool: small
""", encoding="utf-8")
    outcomes = tmp_path / "turns.jsonl"
    with GatewayProcess(pol) as gw:
        for pool in ("small", "large"):
            res = CliRunner().invoke(app, ["replay", *SOURCES, "--gateway", gw.url, "-p", str(pol), "--pool", pool,
                                           "--outcomes", str(outcomes)], env={"COLUMNS": "200"})
            assert res.exit_code == 0, res.output
    got = load_turn_outcomes([outcomes])
    by_pool = {p: [o for o in got if o.pool == p] for p in ("small", "large")}
    assert len(by_pool["small"]) == len(by_pool["large"]) > 6
    assert all(o.passed and o.served_by == "reference (upper bound)" for o in by_pool["large"])
    # The echo passes exactly the turns with nothing to call (miss_param's question back to the user).
    assert {o.passed for o in by_pool["small"]} == {True, False}
    assert all(o.passed == (o.calls == 0 and o.category == "multi_turn_miss_param") for o in by_pool["small"]
               if o.passed)
    out = tmp_path / "r"
    res = CliRunner().invoke(app, ["replay", "--from-outcomes", str(outcomes), "-p", str(ROOT / "policies/default.yaml"),
                                   "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "report.json").read_text())
    assert rep["sessions"] == 6 and rep["large"]["solve_rate"] == 100.0 and rep["large"]["upper_bound"]
    assert rep["small"]["solve_rate"] == 0.0
    names = [r["router"] for r in rep["routers"]]
    assert any("classifier per turn" in n for n in names) and any("classifier per session" in n for n in names)
    assert {"escalate on a tool error", "random (same share)", "oracle (knows the outcomes)"} <= set(names)
    oracle = next(r for r in rep["routers"] if r["router"].startswith("oracle"))
    # The oracle solves every session with only the turns the echo fails on the large pool.
    fails = sum(not o.passed for o in by_pool["small"])
    assert oracle["share_at_95"] is not None and oracle["share_at_95"] <= fails / len(by_pool["small"]) + 1e-9
    for r in rep["routers"]:
        if "classifier" in r["router"] or r["kind"] == "baseline":  # swept to every turn large: large-only's rate
            assert r["points"][-1]["large_share"] == pytest.approx(1.0) and r["points"][-1]["solve_rate"] == 100.0
    # The echo never calls a tool: no tool error, no call count to escalate on.
    assert all(p["large_share"] == 0.0 for r in rep["routers"] if r["router"].startswith("escalate") for p in r["points"])
    assert "reference (upper bound)" in (out / "report.md").read_text()
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 1
    assert (out / "sessions_curve.png").stat().st_size > 5000


def test_router_curves_on_known_outcomes() -> None:
    from switchyard.replay.multiturn.counterfactual import (
        build_table,
        escalation_curves,
        oracle_curve,
        random_curve,
        reach,
    )
    from switchyard.replay.multiturn.outcomes import TurnOutcome

    def o(cid: str, k: int, pool: str, passed: bool, calls: int = 1, err: bool = False) -> TurnOutcome:
        return TurnOutcome(cid, "multi_turn_base", k, 2, pool, pool, passed, None, 1, calls, err, False, 1.0)

    # a: small passes both turns; b: small fails turn 1 (after a tool error there, 3 calls); c: nobody solves turn 0.
    rows = [o("a", 0, "small", True), o("a", 1, "small", True), o("b", 0, "small", True),
            o("b", 1, "small", False, 3, True), o("c", 0, "small", False), o("c", 1, "small", True)]
    rows += [o(x.id, x.turn, "large", x.id != "c" or x.turn != 0) for x in rows]
    table, incomplete = build_table(rows, "small", "large")
    assert not incomplete and len(table) == 3
    oracle = oracle_curve(table, "small", "large")
    assert oracle.points == [(0.0, pytest.approx(100 / 3)), (1 / 6, pytest.approx(200 / 3))]
    rnd = random_curve(table, "small", "large", steps=2)  # p = 0, 0.5, 1: a always, b with p, c never
    assert [r for _, r in rnd.points] == [pytest.approx(100 / 3), pytest.approx(50.0), pytest.approx(200 / 3)]
    err, calls = escalation_curves(table, "small", "large", ns=(3,))
    assert err.points == [(1 / 6, pytest.approx(200 / 3))]  # b's turn 1 escalated: solved
    assert calls.points == [(1 / 6, pytest.approx(200 / 3))]
    assert reach(oracle, 0.9 * 200 / 3) == pytest.approx(1 / 6) and reach(oracle, 80.0) is None
