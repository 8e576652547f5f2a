"""RouteLLM's metrics (APGR, CPT) on small hand-made outcome tables, worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.replay.quality import apgr, bootstrap_apgr, cpt, curve, judge, oracle_curve, random_curve

runner = CliRunner()

# Ten cases: (tools offered, small pool right, large pool right). Small 5/10, large 8/10.
TABLE = [
    (1, True, True), (1, True, True), (1, False, True), (2, True, True), (2, False, False),
    (3, False, True), (3, False, True), (4, True, True), (4, False, True), (5, True, False),
]


def test_curve_apgr_and_cpt_by_hand() -> None:
    small = [s for _, s, _ in TABLE]
    large = [lg for _, _, lg in TABLE]
    # A router that ranks by tools >= 3 only: the five cases with 3+ tools tie above the rest.
    c = curve([1.0 if t >= 3 else 0.0 for t, _, _ in TABLE], small, large)
    # Share 0: 50. Top five (gains +1 +1 0 +1 -1): 70 at share 0.5. All: 80.
    assert c.shares.tolist() == [0.0, 0.5, 1.0] and c.scores.tolist() == pytest.approx([50.0, 70.0, 80.0])
    # PGR 0, 2/3, 1: APGR = 0.5 * (0 + 2/3) / 2 + 0.5 * (2/3 + 1) / 2 = 7/12.
    assert apgr(c) == pytest.approx(7 / 12)
    # PGR 0.5 at 0.75 of the way to share 0.5; 0.8 at 0.4 of the way from 0.5 to 1.
    assert cpt(c, 0.5) == pytest.approx(0.375) and cpt(c, 0.8) == pytest.approx(0.7)
    # Within a tie the curve is the expected score of a random part of it: linear.
    assert c.score_at(0.25) == pytest.approx(60.0) and c.score_at(0.75) == pytest.approx(75.0)
    # Random: one tie group, straight from 50 to 80.
    r = random_curve(small, large)
    assert apgr(r) == pytest.approx(0.5) and cpt(r, 0.5) == pytest.approx(0.5) and cpt(r, 0.8) == pytest.approx(0.8)
    # Oracle: four +1 first (90 at 0.4), five 0 (90 at 0.9), the -1 last (80).
    o = oracle_curve(small, large)
    assert o.shares.tolist() == pytest.approx([0.0, 0.4, 0.9, 1.0]) and o.scores.tolist() == pytest.approx([50, 90, 90, 80])
    assert apgr(o) == pytest.approx(0.4 * (4 / 3) / 2 + 0.5 * (4 / 3) + 0.1 * (4 / 3 + 1) / 2)
    assert cpt(o, 0.5) == pytest.approx(0.15) and cpt(o, 0.8) == pytest.approx(0.24)
    # A router ranking the cases backwards is worse than random; equal pools: nothing to recover.
    back = curve([-g for g in (float(b) - float(a) for a, b in zip(small, large, strict=True))], small, large)
    assert apgr(back) < 0.5 and apgr(curve([0.0] * 3, [True] * 3, [True] * 3)) is None
    # The bootstrap interval is deterministic (fixed seed), brackets APGR, and decides the verdict.
    ci = bootstrap_apgr([1.0 if t >= 3 else 0.0 for t, _, _ in TABLE], small, large)
    assert ci == bootstrap_apgr([1.0 if t >= 3 else 0.0 for t, _, _ in TABLE], small, large)
    assert ci is not None and ci[0] < 7 / 12 < ci[1]
    assert judge(ci) == "does not beat random"  # ten cases cannot tell
    assert judge((0.6, 0.7)) == "beats random" and judge((0.2, 0.4)) == "worse than random"


def _outcomes(path: Path) -> Path:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with path.open("w") as f:
        for k, (tools, small, large) in enumerate(TABLE):
            req = {"model": "x", "messages": [{"role": "user", "content": f"case {k}"}], "tools": [tool] * tools}
            for pool, ok, served in (("small", small, "smollm2-135m"), ("large", large, "reference (upper bound)")):
                f.write(json.dumps({"id": f"c{k}", "category": "hand", "pool": pool, "correct": ok,
                                    "served_by": served, "request": req}) + "\n")
    return path


def test_sweep_report_on_a_hand_made_table(tmp_path: Path) -> None:
    outcomes = _outcomes(tmp_path / "o.jsonl")
    pol = tmp_path / "rules.yaml"
    pol.write_text("""version: 1
name: rules-only
pools:
  small: {model: s, replicas: [{url: "http://127.0.0.1:9/v1"}]}
  large: {model: l, replicas: [{url: "http://127.0.0.1:10/v1"}]}
routes:
  - {name: many-tools, when: {tools: ">= 3"}, pool: large}
  - {name: default, pool: small}
""")
    out = tmp_path / "r"
    res = runner.invoke(app, ["replay", "--from-outcomes", str(outcomes), "-p", str(pol), "--sweep", "--out", str(out)],
                        env={"COLUMNS": "220"})
    assert res.exit_code == 0, res.output
    comp = json.loads((out / "report.json").read_text())["comparison"]
    assert comp["cases"] == 10 and comp["small"]["score"] == 50.0 and comp["large"]["score"] == 80.0
    assert comp["large"]["label"] == "large: reference (upper bound)"
    rows = {r["name"]: r for r in comp["routers"]}
    assert rows["rules-only"] == {"name": "rules-only", "apgr": round(7 / 12, 4), "apgr_ci95": rows["rules-only"]["apgr_ci95"],
                                  "cpt50": 0.375, "cpt80": 0.7, "score_at_25": 60.0, "score_at_50": 70.0,
                                  "verdict": "does not beat random"}
    assert rows["random (baseline)"]["apgr"] == 0.5 and rows["random (baseline)"]["score_at_50"] == 65.0
    assert rows["oracle (knows the outcomes)"]["cpt80"] == 0.24
    assert comp["own_points"]["rules-only"] == {"large_share": 0.5, "score": 70.0}
    # The terminal and the HTML say what the large pool is, and whether the router beats random.
    for text in (res.output, (out / "report.html").read_text()):
        assert "reference (upper bound)" in text and "does not beat random" in text and "APGR" in text
    assert (out / "quality_vs_large_share.png").stat().st_size > 5000


def test_dry_run_table_says_what_the_count_is(tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text("""version: 1
pools:
  small: {model: s, replicas: [{url: "http://127.0.0.1:9/v1"}]}
  large: {model: l, replicas: [{url: "http://127.0.0.1:10/v1"}]}
routes:
  - {name: many-tools, when: {tools: ">= 3"}, pool: large}
  - {name: default, pool: small}
""")
    res = runner.invoke(app, ["replay", "tooluse-92", "--dry-run", "-p", str(pol)], env={"COLUMNS": "220"})
    assert res.exit_code == 0, res.output
    lines = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in res.output.splitlines() if ln.count("│") >= 3}
    assert lines["score /100"] == "not scored"
    large = int(lines["cases to the large pool"].split("/")[0])
    assert lines["cases to the large pool"] == f"{large}/92" and 0 < large < 92
    assert lines["standard"].endswith("/46 to large") and lines["hard"].endswith("/46 to large")
