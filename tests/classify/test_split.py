"""The training split: no replay suite case (nor a near-duplicate of one) is ever trained on."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from classifykit import ROOT

from switchyard.classify.bfcl import Case
from switchyard.classify.model_file import read_meta
from switchyard.classify.split import Groups, Split, SplitError, family, load_suite
from switchyard.datasets import SUITES

SHIPPED_MODELS = sorted((ROOT / "classifiers").glob("*.onnx"))


@pytest.mark.parametrize("model", SHIPPED_MODELS, ids=[m.stem for m in SHIPPED_MODELS])
def test_shipped_models_never_trained_on_a_suite_case(model: Path, bfcl_cases: list[Case]) -> None:
    record = read_meta(model).trained["split"]
    shipped_ids = [c["id"] for c in json.loads(SUITES["tooluse-92"].read_text())["cases"]]
    assert record["suites"]["tooluse-92"] == shipped_ids  # the sidecar names the suite as shipped
    split = Split.from_record(record)
    suite = set(shipped_ids)
    train = {c.id for c in bfcl_cases if not split.held_out(c.id)}
    assert len(train) > 2000 and not train & suite
    assert all(split.reason(i) == "suite tooluse-92" for i in suite)
    # Groups lie on one side, and every case sharing a family or a tool set with a suite case is
    # held out with it: a reworded twin of a replayed case is not training data either.
    sides: dict[str, set[bool]] = defaultdict(set)
    for c in bfcl_cases:
        sides[split.groups.key(c.id)].add(split.held_out(c.id))
    assert all(len(s) == 1 for s in sides.values())
    by_id = {c.id: c for c in bfcl_cases}
    suite_families = {family(i) for i in suite}
    suite_tools = {json.dumps(by_id[i].body.get("tools"), sort_keys=True) for i in suite}
    twins = [c for c in bfcl_cases if family(c.id) in suite_families
             or json.dumps(c.body.get("tools"), sort_keys=True) in suite_tools]
    assert len(twins) > len(suite) and all(c.id not in train for c in twins)


def test_families_and_tool_sets_make_groups() -> None:
    assert family("live_multiple_862-181-3") == "live_multiple:181"
    assert family("live_irrelevance_12-2-0") == "live_irrelevance:2"
    assert family("multi_turn_miss_func_7") == family("multi_turn_base_7") == "multi_turn:7"
    assert family("simple_python_3") == "simple_python_3"
    tool = {"type": "function", "function": {"name": "area", "parameters": {"type": "object"}}}
    other = {"type": "function", "function": {"name": "volume", "parameters": {"type": "object"}}}
    g = Groups()
    g.add("simple_python_1", {"tools": [tool]})
    g.add("parallel_9", {"tools": [tool]})  # same tool set: one group with simple_python_1
    g.add("live_simple_5-3-0", {"tools": [other]})
    g.add("live_simple_6-3-1", {"tools": [tool, other]})  # same family as 5-3-0
    g.add("irrelevance_4", {"messages": []})  # no tools: its own group
    assert g.key("simple_python_1") == g.key("parallel_9") == "parallel_9"  # the smallest name
    assert g.key("live_simple_5-3-0") == g.key("live_simple_6-3-1") == "live_simple:3"
    assert g.key("irrelevance_4") == "irrelevance_4" and g.key("never_added") == "never_added"
    split = Split(g, [load_suite("tooluse-92")], test_share=5)
    assert split.reason("irrelevance_4") in (None, "one group in 5")


def test_suites_a_user_names(tmp_path: Path) -> None:
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text('{"id": "a", "messages": []}\n\n{"messages": []}\n')
    assert load_suite(str(jsonl)).ids == ("a", "mine-3")
    js = tmp_path / "suite.json"
    js.write_text(json.dumps({"cases": [{"id": "x"}, {"id": "y"}]}))
    assert load_suite(str(js)) .ids == ("x", "y")
    assert load_suite("bfcl:live_simple:3").ids == ("live_simple_0-0-0", "live_simple_1-1-0", "live_simple_2-2-0")
    for bad, msg in (("nope", "not a shipped suite"), ("bfcl:nope", "no BFCL category"), ("bfcl:a:b", "expected")):
        with pytest.raises(SplitError, match=msg):
            load_suite(bad)
    with pytest.raises(SplitError, match="retrain"):
        Split.from_record("held out: one in five groups")  # a sidecar from before this split
