"""Trace sources: the tooluse-92 suite, BFCL from a wheel or folder, JSONL with bad lines."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from replay_helpers import policy_file
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.datasets import BFCL, fetch_wheel
from switchyard.gateway.recorder import TraceRecorder
from switchyard.replay.bfcl import BfclData, load_category
from switchyard.replay.cases import TraceError
from switchyard.replay.jsonl import load_jsonl
from switchyard.replay.sources import load_source
from switchyard.replay.suite import BFCL_SAMPLE, SUITES, build, build_tooluse92, load_suite

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def test_tooluse92_loads_and_matches_its_rule() -> None:
    cases = load_suite("tooluse-92")
    assert len(cases) == 92 and len({c.id for c in cases}) == 92
    tiers = [c.tier for c in cases]
    assert tiers.count("standard") == 46 and tiers.count("hard") == 46
    assert all(c.checker == "simple" for c in cases if c.tier == "standard")
    shipped = json.loads(SUITES["tooluse-92"].read_text())
    assert shipped["cases"] == build_tooluse92()["cases"]  # the listed ids are what the rule picks


def test_bfcl_sample_matches_its_rule_and_leaves_tooluse92_out() -> None:
    shipped = json.loads(SUITES["bfcl-sample"].read_text())
    assert shipped["cases"] == build(BFCL_SAMPLE)["cases"]
    ids = [c["id"] for c in shipped["cases"]]
    suite = {c["id"] for c in json.loads(SUITES["tooluse-92"].read_text())["cases"]}
    assert len(ids) == len(set(ids)) == 840 and not set(ids) & suite
    assert len({c["category"] for c in shipped["cases"]}) == 13


def _policy(tmp_path: Path) -> Path:
    # Dry runs never reach the replicas: closed ports are enough.
    return policy_file(tmp_path / "dry.yaml", "http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1")


def test_tooluse92_dry_runs(tmp_path: Path) -> None:
    out = tmp_path / "o"
    res = runner.invoke(app, ["replay", "tooluse-92", "--dry-run", "-p", str(_policy(tmp_path)), "--out", str(out)])
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "report.json").read_text())["runs"][0]
    cases = load_suite("tooluse-92")
    expect_large = sum(len(c.body["tools"]) >= 2 for c in cases)
    assert rep["totals"]["split"] == {"large": expect_large, "small": 92 - expect_large}
    assert rep["totals"]["rules"]["several-tools"] == expect_large
    assert all(c["status"] == "routed" and c["correct"] is None for c in rep["cases"])
    assert "92" in res.output and "several-tools" in res.output


def test_dry_run_with_the_shipped_onnx_classifier(tmp_path: Path) -> None:
    onnx = ROOT / "classifiers" / "tool-complexity.onnx"
    if not onnx.exists():
        pytest.skip("no shipped classifier in this checkout")
    pol = tmp_path / "onnx.yaml"
    pol.write_text(
        f"""version: 1
pools:
  small: {{model: s, replicas: [{{url: "http://127.0.0.1:9/v1"}}]}}
  large: {{model: l, replicas: [{{url: "http://127.0.0.1:10/v1"}}]}}
classifier: {{kind: onnx, path: "{onnx}"}}
routes:
  - name: hard
    when: {{label: complex, confidence: ">= 0.5"}}
    pool: large
  - name: default
    pool: small
""",
        encoding="utf-8",
    )
    out = tmp_path / "o"
    res = runner.invoke(app, ["replay", "tooluse-92", "--dry-run", "-p", str(pol), "--out", str(out)])
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "report.json").read_text())["runs"][0]
    labels = {c["label"] for c in rep["cases"]}
    assert labels <= {"simple", "complex"} and "complex" in labels
    assert all(c["pool"] == ("large" if c["label"] == "complex" and c["confidence"] >= 0.5 else "small")
               for c in rep["cases"])
    assert not rep["totals"]["notes"]  # the classifier was built, not replaced


def test_bfcl_from_wheel_path_and_unpacked_folder(tmp_path: Path) -> None:
    wheel = fetch_wheel(BFCL)
    from_wheel = load_category("simple_python", BfclData(wheel), limit=3)
    with zipfile.ZipFile(wheel) as zf:
        for name in ("BFCL_v4_simple_python.json", "possible_answer/BFCL_v4_simple_python.json"):
            (tmp_path / "data" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "data" / name).write_bytes(zf.read("bfcl_eval/data/" + name))
    from_dir = load_category("simple_python", BfclData(tmp_path), limit=3)
    assert [c.id for c in from_dir] == [c.id for c in from_wheel] == [f"simple_python_{i}" for i in range(3)]
    assert from_dir[0].body == from_wheel[0].body and from_dir[0].expected == from_wheel[0].expected
    with pytest.raises(TraceError, match="no such file"):
        BfclData(tmp_path / "nope")


def test_jsonl_bad_lines_reported_with_line_numbers_rest_replayed(tmp_path: Path) -> None:
    good = {"messages": [{"role": "user", "content": "weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
            "expected": [{"get_weather": {"city": ["Paris"]}}]}
    lines = [
        json.dumps({"id": "a", **good}),
        "{not json",
        json.dumps({"id": "b", "messages": []}),
        json.dumps({"id": "c", **good, "expected": [{"other_fn": {}}]}),
        json.dumps({"id": "d", **good, "expected": [], "session_id": "s1"}),
        json.dumps({"id": "e", "messages": good["messages"]}),
    ]
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(lines) + "\n")
    cases, errors = load_jsonl(f)
    assert [c.id for c in cases] == ["a", "d", "e"]
    assert [(e.line, e.reason.split(":")[0]) for e in errors] == [
        (2, "not valid JSON"), (3, "`messages` must be a non-empty list"), (4, "expected[0]")]
    assert [c.kind for c in cases] == ["ast", "irrelevance", "none"]
    assert cases[1].session_id == "s1" and "expected" not in cases[0].body
    res = runner.invoke(app, ["replay", str(f), "--dry-run", "-p", str(_policy(tmp_path))])
    assert res.exit_code == 0
    assert f"{f}:2" in res.output and f"{f}:3" in res.output and "3" in res.output


def test_missing_file_unknown_category_and_bad_source(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_source(str(tmp_path / "missing.jsonl"))
    pol = str(_policy(tmp_path))
    for args, msg in (
        ([str(tmp_path / "missing.jsonl")], "no such file"),
        (["bfcl:not_a_category"], "unknown BFCL category"),
        (["bfcl:multi_turn_base"], "unsupported category"),
        (["nonsense"], "not a suite"),
    ):
        res = runner.invoke(app, ["replay", *args, "--dry-run", "-p", pol])
        assert res.exit_code == 2 and msg in res.output, res.output
    res = runner.invoke(app, ["replay", "tooluse-92", "--dry-run", "-p", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2 and "no such file" in res.output


def test_recorder_writes_a_replayable_trace(tmp_path: Path) -> None:
    path = tmp_path / "rec" / "trace.jsonl"
    rec = TraceRecorder(path)
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "tools": [], "stream": True}
    for i in range(50):
        rec.record({**body, "messages": [{"role": "user", "content": f"hi {i}"}]}, f"s{i % 3}",
                   {"pool": "small", "rule": "default"})
    rec.close()
    rec.close()  # idempotent
    rec.record(body, None, {})  # after close: ignored
    cases, errors = load_jsonl(path)
    assert errors == [] and len(cases) == 50 and rec.written == 50 and rec.dropped == 0
    assert cases[7].session_id == "s1" and cases[7].body["messages"][0]["content"] == "hi 7"
    assert cases[0].kind == "none" and "model" not in cases[0].body and "stream" not in cases[0].body


def test_cluster_throughput_of_the_split(tmp_path: Path) -> None:
    # spark8: 3 large replicas at rate 2 + 2 small at rate 20, against 4 large replicas.
    cluster, plan = ROOT / "deploy" / "clusters" / "spark8.yaml", ROOT / "policies" / "spark8.yaml"
    if not cluster.exists() or not plan.exists():
        pytest.skip("no spark8 example in this checkout")
    out = tmp_path / "o"
    res = runner.invoke(app, ["replay", "tooluse-92", "--dry-run", "-p", str(_policy(tmp_path)), "--cluster",
                              str(cluster), "--plan-policy", str(plan), "--out", str(out)])
    assert res.exit_code == 0, res.output
    totals = json.loads((out / "report.json").read_text())["runs"][0]["totals"]
    f = totals["large_share"]
    assert 0 < f < 1
    want = min(3 * 2.0 / f, 2 * 20.0 / (1 - f)) / (4 * 2.0)
    assert abs(totals["throughput"]["ratio"] - round(want, 4)) < 1e-9
    assert f"{want:.2f}x" in res.output
    # Without rates in the replayed policy the report says why there is no figure.
    res = runner.invoke(app, ["replay", "tooluse-92", "--dry-run", "-p", str(_policy(tmp_path)), "--cluster",
                              str(cluster)])
    assert res.exit_code == 0 and "rate" in res.output
