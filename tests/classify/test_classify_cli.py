"""`switchyard classifier train --outcomes`, `calibrate`, `eval`, `predict`, run as a user would."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from classifykit import SHIPPED
from typer.testing import CliRunner

from switchyard.classify.bfcl import Case
from switchyard.classify.cli import classifier_app
from switchyard.classify.features import extract
from switchyard.classify.onnx_classifier import OnnxClassifier
from switchyard.classify.split import Split
from switchyard.policy.loader import parse_policy
from switchyard.policy.rules import compile_policy

runner = CliRunner()


def _small_fails(c: Case) -> bool:
    # A stand-in for a small model's real weakness, deliberately unlike the BFCL category labels:
    # it fails whenever three or more tools are offered (live_multiple with two tools is fine).
    return len(c.body.get("tools", [])) >= 3


def _write_outcomes(path: Path, cases: list[Case]) -> None:
    with path.open("w") as f:
        for c in cases:
            for pool, correct in (("small", not _small_fails(c)), ("large", True)):
                f.write(json.dumps({"id": c.id, "pool": pool, "correct": correct, "latency_ms": 100.0,
                                    "prompt_tokens": 10, "completion_tokens": 5, "request": c.body}) + "\n")


@pytest.mark.slow  # trains, evaluates and calibrates a classifier: ~20 s on 2 cores
def test_train_from_outcomes_learns_small_model_failures(tmp_path: Path, bfcl_cases: list[Case]) -> None:
    pytest.importorskip("sklearn")
    cases = bfcl_cases[::6]
    outcomes = tmp_path / "outcomes.jsonl"
    _write_outcomes(outcomes, cases)
    out = tmp_path / "mine.onnx"
    # A suite the user names (their own trace) is held out as well as tooluse-92.
    mine = tmp_path / "my-suite.jsonl"
    mine.write_text("".join(json.dumps({"id": c.id, **c.body}) + "\n" for c in cases[1:40:3]))
    r = runner.invoke(classifier_app, ["train", "--outcomes", str(outcomes), "--out", str(out),
                                       "--hash-dim", "512", "--hold-out-suite", "tooluse-92",
                                       "--hold-out-suite", str(mine)])
    assert r.exit_code == 0, r.output
    assert "held-out accuracy" in r.output and "ROC AUC" in r.output and out.with_suffix(".md").exists()
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["labels"] == ["simple", "complex"] and "small" in meta["trained"]["target"]
    split = Split.from_record(meta["trained"]["split"])
    assert set(meta["trained"]["split"]["suites"]) == {"tooluse-92", "my-suite.jsonl"}
    reasons = [split.reason(c.id) for c in cases[1:40:3]]
    assert set(reasons) <= {"suite my-suite.jsonl", "suite tooluse-92"} and "suite my-suite.jsonl" in reasons
    card = out.with_suffix(".md").read_text()
    assert "outcome router" in card and "Reliability" in card and "`my-suite.jsonl` (13 cases)" in card
    # It learned the outcome, not BFCL's categories: score both models on the outcome target.
    mine, shipped = OnnxClassifier.load(out), OnnxClassifier.load(SHIPPED)
    feats = [extract(c.body) for c in cases]
    truth = np.array([_small_fails(c) for c in cases])
    acc_mine = float(((mine.probabilities_many(feats)[:, 1] >= 0.5) == truth).mean())
    acc_shipped = float(((shipped.probabilities_many(feats)[:, 1] >= 0.5) == truth).mean())
    assert acc_mine >= 0.95 and acc_mine > acc_shipped + 0.05, (acc_mine, acc_shipped)

    r = runner.invoke(classifier_app, ["eval", "--model", str(out), "--outcomes", str(outcomes), "--all"])
    assert r.exit_code == 0 and f"{len(cases)} cases" in r.output
    # Held out only (the split rebuilt from the sidecar): ROC AUC and the reliability table.
    r = runner.invoke(classifier_app, ["eval", "--model", str(out), "--outcomes", str(outcomes)])
    held = sum(split.held_out(c.id) for c in cases)
    assert r.exit_code == 0 and f"{held} cases (held out from its training)" in r.output
    assert "ROC AUC" in r.output and "predicted P" in r.output

    # Calibrated to a share of large calls on the outcomes (a .gz file too), the printed rule
    # routes that share through the real rule engine.
    gz = tmp_path / "outcomes.jsonl.gz"
    gz.write_bytes(gzip.compress(outcomes.read_bytes()))
    r = runner.invoke(classifier_app, ["calibrate", "--model", str(out), "--target-large-share", "0.3",
                                       "--trace", str(gz)])
    assert r.exit_code == 0, r.output
    rules = r.output.split("default route):\n", 1)[1]
    policy = compile_policy(parse_policy(
        "version: 1\npools:\n  small: {model: s, replicas: [{url: 'http://127.0.0.1:9/v1'}]}\n"
        "  large: {model: l, replicas: [{url: 'http://127.0.0.1:10/v1'}]}\nroutes:\n" + rules
        + "  - {name: default, pool: small}\n"))
    large = sum(policy.evaluate(f, mine.predict(f))[0].pool == "large" for f in feats)
    assert abs(large / len(cases) - 0.3) <= 0.02, large / len(cases)


def test_outcomes_errors_are_clear(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "pool": "small", "correct": "yes", "request": {"messages": []}}\n')
    r = runner.invoke(classifier_app, ["train", "--outcomes", str(bad), "--out", str(tmp_path / "x.onnx")])
    assert r.exit_code == 1 and "bad.jsonl:1: `correct` must be true or false" in r.output
    bad.write_text('{"id": "a", "pool": "tiny", "correct": true, "request": {"messages": []}}\n')
    r = runner.invoke(classifier_app, ["train", "--outcomes", str(bad), "--out", str(tmp_path / "x.onnx")])
    assert r.exit_code == 1 and "no outcomes for the small pool 'small'; pools in the file: ['tiny']" in r.output


@pytest.mark.parametrize("target", [0.25, 0.75])
def test_calibrate_threshold_and_printed_rules_route_that_share(
    tmp_path: Path, bfcl_cases: list[Case], target: float
) -> None:
    bodies = [c.body for c in bfcl_cases[::5]]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    r = runner.invoke(classifier_app, ["calibrate", "--target-large-share", str(target), "--trace", str(trace),
                                       "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["requests"] == len(bodies) and abs(res["share"] - target) <= 2 / len(bodies)
    r = runner.invoke(classifier_app, ["calibrate", "--target-large-share", str(target), "--trace", str(trace)])
    rules = r.output.split("default route):\n", 1)[1]
    # Paste the printed rules into a policy, then route the trace with the real rule engine.
    policy = compile_policy(parse_policy(
        "version: 1\npools:\n  small: {model: s, replicas: [{url: 'http://127.0.0.1:9/v1'}]}\n"
        "  large: {model: l, replicas: [{url: 'http://127.0.0.1:10/v1'}]}\nroutes:\n" + rules
        + "  - {name: default, pool: small}\n"
    ))
    clf = OnnxClassifier.load(SHIPPED)
    large = 0
    for b in bodies:
        f = extract(b)
        large += policy.evaluate(f, clf.predict(f))[0].pool == "large"
    assert abs(large / len(bodies) - res["share"]) <= 2 / len(bodies)


def test_predict_one_request(tmp_path: Path) -> None:
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"messages": [{"role": "user", "content": "What is 2+2?"}]}))
    r = runner.invoke(classifier_app, ["predict", str(req)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["label"] in ("simple", "complex") and 0.5 <= out["confidence"] <= 1.0


def test_eval_on_bfcl_held_out_prints_accuracy() -> None:
    r = runner.invoke(classifier_app, ["eval"])
    assert r.exit_code == 0, r.output
    trained = json.loads(SHIPPED.with_suffix(".json").read_text())["trained"]
    assert f"{trained['n_test']} cases (held out from its training), accuracy {trained['held_out_accuracy']:.4f}" in r.output
    assert f"ROC AUC {trained['held_out_probability']['roc_auc']:.4f}" in r.output


def test_outcomes_later_line_wins_and_large_requirement(tmp_path: Path) -> None:
    from switchyard.classify.outcomes import label_cases, read_outcomes

    req = {"messages": [{"role": "user", "content": "hi"}]}
    lines = [
        {"id": "a", "pool": "small", "correct": True, "request": req, "category": "simple_python"},
        {"id": "b", "pool": "small", "correct": False, "request": req},
        {"id": "b", "pool": "large", "correct": False, "request": req},
        {"id": "a", "pool": "small", "correct": False, "request": req, "category": "simple_python"},  # re-run
        {"id": "a", "pool": "large", "correct": True, "request": req},
    ]
    path = tmp_path / "o.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    rows = read_outcomes(path)
    assert [(i, f, c) for i, _, f, c in label_cases(rows)] == [("a", True, "simple_python"), ("b", True, "")]
    # Both pools fail on b: sending it to the large pool buys nothing.
    assert [(i, f) for i, _, f, _ in label_cases(rows, require_large_correct=True)] == [("a", True), ("b", False)]
