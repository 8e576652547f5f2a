"""BFCL AST scoring: ground truth passes on every supported category; wrong answers fail."""

from __future__ import annotations

import copy

import pytest

from switchyard.replay.bfcl import SUPPORTED, UNANSWERABLE, UNSUPPORTED, load_category
from switchyard.replay.cases import Case, TraceError
from switchyard.replay.scoring import check_calls, ground_truth_calls, score_case, standardize
from switchyard.replay.tools import legal_name, to_openai_tools


@pytest.mark.parametrize("category", SUPPORTED)
def test_ground_truth_scores_100(category: str) -> None:
    cases = load_category(category)
    assert cases
    failed = []
    for c in cases:
        v = score_case(c, ground_truth_calls(c))
        assert v is not None
        if not v.correct and c.id not in UNANSWERABLE:
            failed.append((c.id, v.error))
    assert failed == []
    answerable = [c for c in cases if c.id not in UNANSWERABLE]
    score = 100 * sum(bool(score_case(c, ground_truth_calls(c)).correct) for c in answerable) / len(answerable)
    assert score == 100.0


def test_unanswerable_cases_fail_under_bfcl_rules() -> None:
    # These BFCL answers contradict their own function docs; BFCL's rules fail every answer.
    for c in load_category("live_multiple", ids=sorted(UNANSWERABLE)):
        v = score_case(c, ground_truth_calls(c))
        assert not v.correct and ("unexpected parameter" in v.error or "missing required" in v.error)


def _first_with(category: str, pred) -> Case:
    for c in load_category(category):
        if pred(c):
            return c
    raise AssertionError("no such case")


AST_CATEGORIES = [c for c in SUPPORTED if "irrelevance" not in c and c != "live_relevance"]


@pytest.mark.parametrize("category", AST_CATEGORIES)
def test_wrong_value_missing_param_extra_call_fail(category: str) -> None:
    cases = load_category(category, limit=40)
    checked = 0
    for c in cases:
        good = ground_truth_calls(c)
        # wrong value: change a required param that has a single allowed scalar value
        name, args = next(iter(good[0].items()))
        required = c.functions[name]["parameters"].get("required") or []
        for p in required:
            v = args.get(p)
            if isinstance(v, int | float | str) and not isinstance(v, bool):
                bad = copy.deepcopy(good)
                bad[0][name][p] = (v + 7919) if not isinstance(v, str) else v + " zzz"
                assert not score_case(c, bad).correct, (c.id, p)
                missing = copy.deepcopy(good)
                del missing[0][name][p]
                verdict = score_case(c, missing)
                assert not verdict.correct, (c.id, verdict)
                if c.checker != "parallel":  # parallel reports the last candidate it tried
                    assert "missing required" in verdict.error, (c.id, verdict)
                checked += 1
                break
        extra = copy.deepcopy(good) + [copy.deepcopy(good[0])]
        assert not score_case(c, extra).correct
        assert not score_case(c, []).correct
        assert not score_case(c, None).correct
    assert checked >= 10


def test_parallel_calls_match_in_any_order() -> None:
    c = _first_with("parallel", lambda c: len(c.expected) >= 2)
    good = ground_truth_calls(c)
    assert score_case(c, list(reversed(good))).correct
    assert not score_case(c, good[:1]).correct


def test_type_rules_int_for_float_bool_not_int_and_string_normalisation() -> None:
    doc = {"f": {"name": "f", "parameters": {"type": "dict", "required": ["x", "n", "city"], "properties": {
        "x": {"type": "float"}, "n": {"type": "integer"}, "city": {"type": "string"},
        "opt": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
        "cfg": {"type": "dict", "properties": {"a": {"type": "string"}}}}}}}
    exp = [{"f": {"x": [2.0], "n": [3], "city": ["New York, NY"], "opt": ["", "yes"],
                  "tags": [["Red Wine", "blue"], ""], "cfg": [{"a": ["Hot"]}, ""]}}]

    def check(args: dict) -> bool:
        return check_calls(doc, [{"f": args}], exp, "simple").correct

    base = {"x": 2, "n": 3, "city": "new york ny"}
    assert check(base)  # int accepted for float; case, spaces and punctuation ignored
    assert check({**base, "x": 2.0})
    assert not check({**base, "n": 3.0})  # a float is not an int
    assert not check({**base, "n": True})  # a bool is not an int
    assert not check({**base, "city": "Boston"})
    assert check({**base, "opt": "yes"}) and not check({**base, "opt": "no"})
    assert check({**base, "tags": ["red-wine", "Blue"]}) and not check({**base, "tags": ["blue", "red wine"]})
    assert check({**base, "cfg": {"a": "hot"}}) and not check({**base, "cfg": {"a": "cold"}})
    assert not check({**base, "cfg": {"a": "hot", "b": "x"}})
    assert not check({**base, "unknown": 1})
    assert standardize("April 1, 2024") == standardize("april 1 2024")


def test_irrelevance_and_relevance() -> None:
    irr = load_category("irrelevance", limit=1)[0]
    assert score_case(irr, []).correct
    name = next(iter(irr.functions))
    assert not score_case(irr, [{name: {}}]).correct
    rel = load_category("live_relevance", limit=1)[0]
    assert score_case(rel, ground_truth_calls(rel)).correct
    assert not score_case(rel, []).correct


def test_dotted_names_made_legal_and_mapped_back() -> None:
    c = _first_with("parallel", lambda c: any("." in n for n in c.name_map.values()))
    for legal, original in c.name_map.items():
        assert "." not in legal and len(legal) <= 64
        assert legal.replace("_", "") == original.replace(".", "").replace("_", "") or legal != original
    tools, name_map, _ = to_openai_tools([{"name": "a.b", "parameters": {}}, {"name": "a_b", "parameters": {}}])
    assert len({t["function"]["name"] for t in tools}) == 2 and set(name_map.values()) == {"a.b", "a_b"}
    long = legal_name("x." * 60, set())
    assert len(long) <= 64


def test_bfcl_types_become_json_schema() -> None:
    c = _first_with("live_multiple", lambda c: '"dict"' in str(c.functions).replace("'", '"'))
    text = str(c.body["tools"])
    assert "'dict'" not in text and "'float'" not in text and "'tuple'" not in text


@pytest.mark.parametrize("category", ["multi_turn_base", "memory", "web_search", "format_sensitivity"])
def test_unsupported_categories_say_so(category: str) -> None:
    assert category in UNSUPPORTED
    with pytest.raises(TraceError, match="unsupported category"):
        load_category(category)


def test_unknown_category() -> None:
    with pytest.raises(TraceError, match="unknown BFCL category 'no_such_thing'"):
        load_category("no_such_thing")


def test_java_and_javascript_arguments_are_literals() -> None:
    from switchyard.replay.langs import read_literal

    java = _first_with("simple_java", lambda c: any(
        (p.get("type") == "Array") for f in c.functions.values() for p in f["parameters"]["properties"].values()))
    assert all(p["type"] == "string" for t in java.body["tools"]
               for p in t["function"]["parameters"]["properties"].values())
    good = ground_truth_calls(java)
    assert score_case(java, good).correct
    name, args = next(iter(good[0].items()))
    props = java.functions[name]["parameters"]["properties"]
    arr = next(p for p in args if props[p]["type"] == "Array" and args[p].startswith("new"))
    values = read_literal(args[arr])
    for form in (f"new int[]{{{', '.join(map(str, values))}}}", f"Arrays.asList({', '.join(map(str, values))})"):
        if all(isinstance(v, int) for v in values):
            assert score_case(java, [{name: {**args, arr: form}}]).correct, form
    assert not score_case(java, [{name: {**args, arr: "new int[]{}"}}]).correct
    assert not score_case(java, [{name: {**args, arr: values}}]).correct  # not a string: wrong
    js = _first_with("simple_javascript", lambda c: any(
        p.get("type") == "Boolean" for f in c.functions.values() for p in f["parameters"]["properties"].values()))
    name, args = next(iter(ground_truth_calls(js)[0].items()))
    flag = next(p for p, q in js.functions[name]["parameters"]["properties"].items() if q["type"] == "Boolean")
    truth = args[flag]
    assert score_case(js, [{name: args}]).correct
    flipped = "false" if truth == "true" else "true"
    assert not score_case(js, [{name: {**args, flag: flipped}}]).correct
    assert read_literal("{a: 1, 'b': [1, 2], c: {d: true}}") == {"a": 1, "b": [1, 2], "c": {"d": True}}
    assert read_literal('new HashMap<String, Object>() {{ put("k", 5L); }}') == {"k": 5}
