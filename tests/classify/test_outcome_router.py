"""The shipped outcome router is what its card's command trains from the shipped outcomes, and
those outcomes are SmolLM2's and the reference pool's answers to every case of the two suites."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from switchyard.classify.cli import classifier_app
from switchyard.replay.sources import load_sources

ROOT = Path(__file__).resolve().parents[2]
OUTCOMES = ROOT / "data" / "outcomes" / "smollm2-135m.jsonl.gz"
MODEL = ROOT / "classifiers" / "smollm2-fails.onnx"


def test_the_shipped_outcomes_cover_both_suites_for_both_pools() -> None:
    rows = [json.loads(line) for line in gzip.decompress(OUTCOMES.read_bytes()).decode().splitlines()]
    cases, errors = load_sources(["tooluse-92", "bfcl-sample"])
    assert not errors
    ids = {c.id for c in cases}
    for pool in ("small", "large"):
        assert {r["id"] for r in rows if r["pool"] == pool} == ids
    served = Counter((r["pool"], r["served_by"]) for r in rows)
    assert served[("large", "reference (upper bound)")] == len(ids)  # labelled as what it is
    assert all(r["correct"] for r in rows if r["pool"] == "large")


def test_the_shipped_outcome_router_is_what_its_command_trains(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    out = tmp_path / "smollm2-fails.onnx"
    r = CliRunner().invoke(classifier_app, ["train", "--outcomes", str(OUTCOMES), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == MODEL.read_bytes()
    timing = {"command", "fit_seconds", "latency_us_features_plus_onnx"}  # where and how fast it ran

    def trained(p: Path) -> dict:
        return {k: v for k, v in json.loads(p.with_suffix(".json").read_text())["trained"].items() if k not in timing}

    assert trained(out) == trained(MODEL)  # the split, the held-out scores, the reliability table
