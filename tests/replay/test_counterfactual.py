"""--from-outcomes and --sweep on 1,000 real BFCL requests, and the side-by-side report."""

from __future__ import annotations

import json
import time
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.replay.bfcl import load_category
from switchyard.replay.scoring import ground_truth_calls, score_case

runner = CliRunner()


def _outcomes(tmp_path: Path) -> tuple[Path, dict[str, dict[str, bool]], dict[str, int]]:
    """Outcomes of two pools on 1,000 BFCL cases: "large" answers with the ground truth;
    "small" drops the last call, so it fails exactly the cases that need a call."""
    cases = (load_category("simple_python", limit=300) + load_category("multiple", limit=200)
             + load_category("parallel", limit=200) + load_category("live_multiple", limit=220)
             + load_category("irrelevance", limit=80))
    assert len(cases) == 1000
    correct: dict[str, dict[str, bool]] = {}
    tools: dict[str, int] = {}
    path = tmp_path / "outcomes.jsonl"
    with path.open("wb") as f:
        for c in cases:
            gt = ground_truth_calls(c)
            answers = {"large": gt, "small": gt[:-1]}
            correct[c.id] = {}
            tools[c.id] = len(c.body["tools"])
            for pool, calls in answers.items():
                ok = bool(score_case(c, calls).correct)
                correct[c.id][pool] = ok
                f.write(orjson.dumps({
                    "id": c.id, "category": c.category, "pool": pool, "correct": ok,
                    "latency_ms": 100.0 if pool == "large" else 10.0, "prompt_tokens": 50,
                    "completion_tokens": 5, "request": c.request(pool)}) + b"\n")
    return path, correct, tools


def _policy(tmp_path: Path, name: str, threshold: int) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(
        f"""version: 1
pools:
  small: {{model: s, replicas: [{{url: "http://127.0.0.1:9/v1"}}]}}
  large: {{model: l, replicas: [{{url: "http://127.0.0.1:10/v1"}}]}}
routes:
  - name: toolset
    when: {{tools: ">= {threshold}"}}
    pool: large
  - name: default
    pool: small
""",
        encoding="utf-8",
    )
    return p


def test_counterfactual_1000_cases_under_5s_and_correct(tmp_path: Path) -> None:
    path, correct, tools = _outcomes(tmp_path)
    p2, p4 = _policy(tmp_path, "two", 2), _policy(tmp_path, "four", 4)
    t0 = time.perf_counter()
    res = runner.invoke(app, ["replay", "--from-outcomes", str(path), "-p", str(p2)])
    elapsed = time.perf_counter() - t0
    assert res.exit_code == 0, res.output
    assert elapsed < 5.0, elapsed
    out = tmp_path / "o"
    res = runner.invoke(app, ["replay", "--from-outcomes", str(path), "-p", str(p2), "-p", str(p4),
                              "--sweep", "--out", str(out)])
    assert res.exit_code == 0, res.output
    runs = json.loads((out / "report.json").read_text())["runs"]
    for run, threshold in zip(runs, (2, 4), strict=True):
        expected_pool = {cid: "large" if n >= threshold else "small" for cid, n in tools.items()}
        want = 100 * sum(correct[cid][p] for cid, p in expected_pool.items()) / 1000
        assert run["totals"]["cases"] == 1000 and abs(run["totals"]["score"] - round(want, 2)) < 1e-9
        assert {c["id"]: c["pool"] for c in run["cases"]} == expected_pool
        lat = run["totals"]["pools"]["large"]["latency_p50_ms"]
        assert lat == 100.0 and run["totals"]["pools"]["small"]["latency_p50_ms"] == 10.0
        # The sweep: no classifier, so the rules alone rank the cases: the curve goes from
        # all-small through the policy's own point to all-large; random goes straight across.
        sweep = run["sweep"]
        all_small = 100 * sum(v["small"] for v in correct.values()) / 1000
        for kind in ("router", "random"):
            pts = [p for p in sweep if p["kind"] == kind]
            assert pts[0]["large_share"] == 0.0 and abs(pts[0]["score"] - all_small) < 1e-3
            assert pts[-1]["large_share"] == 1.0 and pts[-1]["score"] == 100.0
        own = (run["totals"]["large_share"], run["totals"]["score"])
        assert [(p["large_share"], p["score"]) for p in sweep if p["kind"] == "router"][1] == pytest.approx(own, abs=1e-3)
    assert "two" in res.output and "four" in res.output  # one table, side by side
    for png in ("quality_vs_large_share.png", "split.png", "latency.png"):
        assert (out / png).stat().st_size > 1000


def test_sweep_moves_with_the_classifier_threshold(tmp_path: Path) -> None:
    # With the shipped ONNX classifier, a lower threshold never sends fewer cases to large.
    root = Path(__file__).resolve().parents[2]
    onnx = root / "classifiers" / "tool-complexity.onnx"
    if not onnx.exists():
        pytest.skip("no shipped classifier in this checkout")
    path, _, _ = _outcomes(tmp_path)
    pol = tmp_path / "c.yaml"
    pol.write_text(
        f"""version: 1
pools:
  small: {{model: s, replicas: [{{url: "http://127.0.0.1:9/v1"}}]}}
  large: {{model: l, replicas: [{{url: "http://127.0.0.1:10/v1"}}]}}
classifier: {{kind: onnx, path: "{onnx}"}}
routes:
  - name: hard
    when: {{label: complex, confidence: ">= 0.6"}}
    pool: large
  - name: default
    pool: small
""",
        encoding="utf-8",
    )
    out = tmp_path / "o"
    res = runner.invoke(app, ["replay", "--from-outcomes", str(path), "-p", str(pol), "--sweep", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "report.json").read_text())["runs"][0]
    pts = [p for p in run["sweep"] if p["kind"] == "router"]
    shares = [p["large_share"] for p in pts]
    thresholds = [p["threshold"] for p in pts[1:]]  # P(complex) at each corner, falling as the share grows
    assert shares == sorted(shares) and shares[0] == 0.0 and shares[-1] == 1.0 and len(pts) > 20
    assert thresholds == sorted(thresholds, reverse=True) and pts[-1]["score"] == 100.0
    # The policy as configured sits on its curve at threshold 0.6.
    at = [p for p in pts[1:] if p["threshold"] >= 0.6][-1]
    assert (at["large_share"], at["score"]) == pytest.approx((run["totals"]["large_share"], run["totals"]["score"]),
                                                             abs=1e-3)


def test_outcomes_bad_lines_and_missing_pool(tmp_path: Path) -> None:
    path, _, _ = _outcomes(tmp_path)
    lines = path.read_bytes().splitlines()
    # Keep 10 cases; drop the large outcome of one; add a broken line.
    keep = [ln for ln in lines[:20] if not (b'"simple_python_0"' in ln and b'"large"' in ln)]
    f = tmp_path / "few.jsonl"
    f.write_bytes(b"\n".join(keep[:5] + [b"{oops"] + keep[5:]) + b"\n")
    pol = _policy(tmp_path, "all-large", 0)
    out = tmp_path / "o"
    res = runner.invoke(app, ["replay", "--from-outcomes", str(f), "-p", str(pol), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"{f}:6" in res.output
    run = json.loads((out / "report.json").read_text())["runs"][0]
    assert run["totals"]["missing"] == 1 and run["totals"]["scored"] == 9
