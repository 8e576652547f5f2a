"""`switchyard reference-pool`: a real upstream answering with the reference calls, labelled as
the upper bound it is; and `replay --held-out` keeping to cases no classifier trained on."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from replay_helpers import wait_http
from typer.testing import CliRunner

from switchyard.classify.model_file import read_meta
from switchyard.classify.split import Split
from switchyard.cli import app
from switchyard.replay.bfcl import load_category
from switchyard.replay.gateway import free_port

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "switchyard.cli", "reference-pool", "tooluse-92",
                             "bfcl:simple_python:40", "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_reference_pool_scores_the_upper_bound_and_says_so(reference: str, tmp_path: Path) -> None:
    outcomes = tmp_path / "o.jsonl"
    out = tmp_path / "r"
    res = runner.invoke(app, ["replay", "tooluse-92", "--gateway", reference, "--pool", "large",
                              "--outcomes", str(outcomes), "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    totals = json.loads((out / "report.json").read_text())["runs"][0]["totals"]
    assert totals["score"] == 100.0 and totals["scored"] == 92  # every reference answer passes the scorer
    assert "pool large: reference (upper bound)" in res.output
    lines = [json.loads(x) for x in outcomes.read_text().splitlines()]
    assert len(lines) == 92 and {x["served_by"] for x in lines} == {"reference (upper bound)"}


def test_reference_pool_refuses_what_it_does_not_know(reference: str) -> None:
    case = load_category("simple_python", limit=1)[0]
    ok = httpx.post(reference + "/v1/chat/completions", json={**case.body, "model": "large"})
    assert ok.status_code == 200 and ok.json()["model"] == "reference (upper bound)"
    assert ok.json()["choices"][0]["finish_reason"] == "tool_calls"
    for body, code in (({"messages": [{"role": "user", "content": "hi"}]}, "unknown_case"),
                       ({**case.body, "stream": True}, "unsupported"), ({"messages": "x"}, None)):
        r = httpx.post(reference + "/v1/chat/completions", json=body)
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == code and err["type"] == "invalid_request_error", r.text
    r = httpx.post(reference + "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.get(reference + "/v1/nothing")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_held_out_keeps_only_cases_no_classifier_trained_on(reference: str, tmp_path: Path) -> None:
    # Outcomes of the suite and of 40 simple_python cases, most of which the shipped model trained on.
    outcomes = tmp_path / "o.jsonl"
    for pool in ("small", "large"):
        res = runner.invoke(app, ["replay", "tooluse-92", "bfcl:simple_python:40", "--gateway", reference,
                                  "--pool", pool, "--outcomes", str(outcomes)])
        assert res.exit_code == 0, res.output
    # The "small" lines: the small model fails every case with a number in its request.
    lines = [json.loads(x) for x in outcomes.read_text().splitlines()]
    for x in lines:
        if x["pool"] == "small":
            x["correct"] = not any(ch.isdigit() for ch in json.dumps(x["request"]["messages"]))
    outcomes.write_text("".join(json.dumps(x) + "\n" for x in lines))
    policy = ROOT / "policies" / "default.yaml"
    out = tmp_path / "r"
    res = runner.invoke(app, ["replay", "--from-outcomes", str(outcomes), "-p", str(policy), "--held-out",
                              "--sweep", "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    split = Split.from_record(read_meta(ROOT / "classifiers" / "tool-complexity.onnx").trained["split"])
    ids = {x["id"] for x in lines}
    held = {i for i in ids if split.held_out(i)}
    assert len(ids) > 120 and 92 < len(held) < len(ids)  # every suite case, and a few simple_python ones
    data = json.loads((out / "report.json").read_text())
    assert {c["id"] for c in data["runs"][0]["cases"]} == held and data["comparison"]["cases"] == len(held)
    assert f"{len(held)} of {len(ids)} cases: those held out from the training of tool-complexity.onnx" in res.output
    # A policy without a trained classifier cannot say what is held out.
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\npools:\n  small: {model: s, replicas: [{url: 'http://127.0.0.1:9/v1'}]}\n"
                     "  large: {model: l, replicas: [{url: 'http://127.0.0.1:10/v1'}]}\n"
                     "routes:\n  - {name: d, pool: small}\n")
    res = runner.invoke(app, ["replay", "--from-outcomes", str(outcomes), "-p", str(rules), "--held-out"])
    assert res.exit_code == 2 and "none of the policies uses a trained classifier" in res.output
