"""Replay's cost per run and what the routed policy saved against the large pool alone."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.policy.schema import PolicySpec, PoolSpec, PriceSpec
from switchyard.replay.cost import price_run
from switchyard.replay.results import CaseResult, RunResult
from switchyard.replay.summary import summarize

POLICY = """version: 1
pools:
  small: {model: s, price: {prompt: 0.1, completion: 0.4}, replicas: [{url: "http://127.0.0.1:9/v1"}]}
  large: {model: l, price: {prompt: 2, completion: 8, cached: 0.5}, replicas: [{url: "http://127.0.0.1:10/v1"}]}
routes:
  - {name: toolset, when: {tools: ">= 2"}, pool: large}
  - {name: default, pool: small}
"""


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


def test_counterfactual_cost_and_savings_from_both_pools_outcomes(tmp_path: Path) -> None:
    # Four cases: two with one tool (the policy sends them to small), two with three (large).
    # Each pool's saved outcome has its own token counts: large-only is priced with large's own.
    path = tmp_path / "outcomes.jsonl"
    lines = []
    for i in range(4):
        req = {"messages": [{"role": "user", "content": f"case {i}"}],
               "tools": [_tool(f"f{j}") for j in range(1 if i < 2 else 3)]}
        lines.append({"id": f"c{i}", "pool": "small", "correct": True, "request": req,
                      "prompt_tokens": 100, "completion_tokens": 10})
        lines.append({"id": f"c{i}", "pool": "large", "correct": True, "request": req,
                      "prompt_tokens": 100, "completion_tokens": 20, "cached_tokens": 40})
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    policy = tmp_path / "priced.yaml"
    policy.write_text(POLICY)
    res = CliRunner().invoke(app, ["replay", "--from-outcomes", str(path), "-p", str(policy), "--out",
                                   str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "saved vs large-only" in res.output
    s = json.loads((tmp_path / "out" / "report.json").read_text())["runs"][0]["totals"]
    small = (100 * 0.1 + 10 * 0.4) / 1e6
    large = (60 * 2 + 40 * 0.5 + 20 * 8) / 1e6
    assert s["split"] == {"small": 2, "large": 2}
    assert s["cost_usd"] == pytest.approx(2 * small + 2 * large)
    assert s["large_only_cost_usd"] == pytest.approx(4 * large)
    assert s["saved_usd"] == pytest.approx(2 * large - 2 * small)
    assert s["saved_pct"] == pytest.approx(round(100 * (2 * large - 2 * small) / (4 * large), 2))
    assert s["pools"]["small"]["cost_usd"] == pytest.approx(2 * small)


def test_live_costs_take_the_gateways_word_and_estimate_large_only() -> None:
    spec = PolicySpec(pools={
        "small": PoolSpec(model="s", replicas=[{"url": "http://a/v1"}], price=PriceSpec(prompt=1, completion=2)),
        "large": PoolSpec(model="l", replicas=[{"url": "http://b/v1"}], price=PriceSpec(prompt=10, completion=20)),
    }, routes=[{"name": "d", "pool": "small"}])
    rs = [CaseResult("a", "x", pool="small", prompt_tokens=100, completion_tokens=10, cost_usd=0.5),
          CaseResult("b", "x", pool="small", prompt_tokens=100, completion_tokens=10),
          CaseResult("c", "x", pool="large", prompt_tokens=10, completion_tokens=1),
          CaseResult("d", "x", pool="small", status="error")]
    run = RunResult("p", "live", rs, large_pool="large")
    price_run(run, spec)
    assert rs[0].cost_usd == 0.5  # what the gateway said it charged
    assert rs[1].cost_usd == pytest.approx(120e-6) and rs[1].large_cost_usd == pytest.approx(1200e-6)
    assert rs[2].cost_usd == rs[2].large_cost_usd == pytest.approx(120e-6)
    assert rs[3].cost_usd is None and rs[3].large_cost_usd is None
    s = summarize(run)
    assert s["large_only_cost_usd"] == pytest.approx(2 * 1200e-6 + 120e-6)
    assert any("priced with their own tokens" in n for n in run.notes)
