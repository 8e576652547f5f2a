"""Features: every valid OpenAI message shape, the cues they compute, and the vectorizer's row."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from switchyard.classify.features import NUMERIC_NAMES, TEXT_SCAN_CHARS, extract
from switchyard.classify.vectorize import FeatureSpec, Vectorizer

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
    },
}


def test_whole_conversation_with_tool_loop() -> None:
    body = {
        "model": "auto",
        "tools": [TOOL, TOOL],
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": [{"type": "text", "text": "And both Rome and Oslo, then Bern, for each of them?"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
                {"id": "c3", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
            ]},
            {"role": "tool", "tool_call_id": "c2", "content": "Error: city service failed (timeout)"},
        ],
    }
    f = extract(body, {"x-tenant": "a"})
    assert f.tools == 2 and f.tool_params == 4
    assert f.tool_schema_chars > 100
    assert f.turns == 2 and f.messages == 8
    assert f.text.startswith("And both Rome")  # the last user turn, from list content
    assert f.tool_result and f.tool_error
    assert f.tool_calls_so_far == 3
    assert f.parallel_cues >= 3  # both, then, for each (of)
    assert f.enumerations >= 3  # commas and " and "
    assert f.questions == 1
    assert f.system_chars == len("You are helpful.")
    assert f.prompt_tokens >= f.prompt_chars // 4
    assert f.headers == {"x-tenant": "a"}


def test_tool_result_that_is_not_an_error_and_legacy_functions() -> None:
    body = {
        "functions": [{"name": "f", "parameters": {"type": "object", "properties": {"a": {}}}}],
        "messages": [
            {"role": "user", "content": "call f"},
            {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "function", "name": "f", "content": "42"},
        ],
    }
    f = extract(body)
    assert (f.tools, f.tool_params, f.tool_calls_so_far) == (1, 1, 1)
    assert f.tool_result and not f.tool_error


def test_completions_prompt_and_empty_bodies() -> None:
    assert extract({"prompt": "count 1, 2 and 3"}).numbers == 3
    assert extract({"prompt": ["a", "b"]}).text == "a\nb"
    empty = extract({})
    assert (empty.turns, empty.messages, empty.text, empty.tokens) == (0, 0, "", [])


def test_work_is_bounded_for_huge_text() -> None:
    f = extract({"messages": [{"role": "user", "content": "word " * 100_000}]})
    assert len(f.tokens) <= TEXT_SCAN_CHARS // 2
    assert f.user_chars == 500_000


_text = st.text(max_size=80)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": _text})}),
    _json,
)
_content = st.one_of(st.none(), _text, st.lists(_part, max_size=3), _json)
_call = st.fixed_dictionaries(
    {"id": _text, "type": st.just("function"),
     "function": st.fixed_dictionaries({"name": _text, "arguments": st.one_of(_text, _json)})}
)
_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": _content}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": _content,
                           "tool_calls": st.one_of(st.lists(_call, max_size=3), _json)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": _text, "content": _content}),
    st.fixed_dictionaries({"role": st.just("function"), "name": _text, "content": _content}),
    _json,
)
_body = st.fixed_dictionaries(
    {},
    optional={
        "model": _json,
        "messages": st.one_of(st.lists(_message, max_size=6), _json),
        "tools": st.one_of(st.lists(st.one_of(st.just(TOOL), _json), max_size=3), _json),
        "functions": _json,
        "prompt": st.one_of(_text, st.lists(_text, max_size=3), _json),
    },
)


@settings(max_examples=120, deadline=None)
@given(_body)
def test_any_body_shape_gives_sane_features_and_a_finite_row(body: dict) -> None:
    f = extract(body)
    nums = f.numeric()
    assert len(nums) == len(NUMERIC_NAMES)
    assert all(math.isfinite(v) and v >= 0 for v in nums)
    assert isinstance(f.text, str) and isinstance(f.model, str)
    row = Vectorizer(FeatureSpec(hash_dim=256)).row(f)
    assert row.shape == (1, 256 + len(NUMERIC_NAMES)) and row.dtype == np.float32
    assert np.isfinite(row).all()
    text_norm = float(np.linalg.norm(row[0, :256]))
    assert text_norm == 0.0 if not f.tokens else abs(text_norm - 1.0) < 1e-5


def test_hashing_is_stable_across_processes() -> None:
    # crc32, not Python's salted hash(): the same text lands in the same buckets in every process.
    import subprocess
    import sys

    code = (
        "from switchyard.classify.features import extract;"
        "from switchyard.classify.vectorize import FeatureSpec, Vectorizer;"
        "print(sorted(Vectorizer(FeatureSpec()).text_indices(extract({'prompt': 'Book two flights'}).tokens)))"
    )
    root = Path(__file__).resolve().parents[2]
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                           env={"PYTHONHASHSEED": str(seed), "PATH": ""}).stdout for seed in (1, 2)}
    here = sorted(Vectorizer(FeatureSpec()).text_indices(extract({"prompt": "Book two flights"}).tokens))
    assert outs == {f"{here}\n"}


def test_text_cues_left_for_the_classifier_give_the_same_label() -> None:
    """The gateway extracts without text cues (rules never read them); the ONNX classifier
    fills them in, so its answer is the same as from fully extracted features."""
    from switchyard.policy.classifier import build_classifier
    from switchyard.policy.schema import ClassifierSpec

    clf = build_classifier(ClassifierSpec(kind="onnx", path="classifiers/tool-complexity.onnx"), Path("."), None)
    body = {"model": "auto", "messages": [{"role": "user", "content": "Compute both 3+4 and 5*6, then plot each."}],
            "tools": [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]}
    lazy = extract(body, text_cues=False)
    assert not lazy.cues_done and lazy.tokens == [] and lazy.parallel_cues == 0
    full = extract(body)
    assert full.cues_done and full.parallel_cues >= 2
    a, b = clf.predict(lazy), clf.predict(full)
    assert (a.name, round(a.confidence, 6)) == (b.name, round(b.confidence, 6))
    assert lazy.tokens == full.tokens
