"""Anthropic Messages end to end: the real anthropic SDK against the real gateway in front of our
engine serving SmolLM2 (the session's shared int4 server, tests/conftest.py; greedy, a few tokens),
translated to chat and back."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import pytest
from procs import start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.engine]

POLICY = """
version: 1
name: agents
pools:
  small:
    model: smollm2-135m
    health: {{interval: 0}}
    # The pool's window, under the engine's own (8,192: SMOLLM2_SERVER_ARGS, tests/conftest.py). Claude
    # Code's max_tokens 32000 is lowered to what this window leaves by the gateway's estimate of the
    # prompt, which does not see the engine's own tool instructions (~90 tokens of SmolLM2's prompt):
    # 1,024 less that much in hand.
    max_model_len: 896
    replicas: [{{url: '{url}/v1', name: e0}}]
routes: [{{name: default, pool: small}}]
"""

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                            "required": ["city"]}}
TIME = {"name": "get_time", "description": "The time in a time zone.",
        "input_schema": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 12}},
                         "required": ["tz"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(smollm2_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[anthropic.Anthropic]:
    tmp = tmp_path_factory.mktemp("msg-gw")
    (tmp / "agents.yaml").write_text(POLICY.format(url=smollm2_server.url))
    proc, url = start_gateway(tmp, [tmp / "agents.yaml"])
    try:
        yield anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    finally:
        proc.stop()


# This SDK has no temperature argument any more; the API (and the gateway) still take it.
GREEDY = {"temperature": 0}


def create(c: anthropic.Anthropic, **kw) -> anthropic.types.Message:
    return c.messages.create(**{"model": "auto", "max_tokens": 8, "messages": ASK, "extra_body": GREEDY, **kw})


def without_ids(m: anthropic.types.Message) -> dict:
    """A message less what each request draws anew: its id, its tool calls' ids, and how its prompt
    splits into cached and not (the engine's prefix cache holds the previous request's)."""
    d = m.model_dump(exclude={"id"})
    for b in d["content"]:
        b.pop("id", None)
    u = d["usage"]
    u["input_tokens"] += u.pop("cache_read_input_tokens")
    return d


def prompt_of(m: anthropic.types.Message) -> int:
    return m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_plain_and_with_system(client):
    raw = client.messages.with_raw_response.create(model="auto", max_tokens=8, messages=ASK, extra_body=GREEDY)
    m = raw.parse()
    assert raw.headers["x-switchyard-pool"] == "small"
    assert m.type == "message" and m.role == "assistant" and m.model == "auto"
    assert m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens > 5 and 0 < m.usage.output_tokens <= 8
    # SmolLM2's template puts its own short system prompt where none is given: this one is longer.
    system = "You are a terse meteorologist. " * 12
    s = create(client, system=system)
    assert prompt_of(s) > prompt_of(m) + 40  # the system prompt reached the model
    assert s.content[0].text


def test_stream_accumulates_to_the_same_message(client):
    want = create(client, max_tokens=12)
    with client.messages.stream(model="auto", max_tokens=12, messages=ASK, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        got = s.get_final_message()
    assert text == want.content[0].text
    assert without_ids(got) == without_ids(want)


@pytest.fixture(scope="module")
def named(client) -> anthropic.types.Message:
    """A call forced by name (one request shared by the tests that need one)."""
    return create(client, max_tokens=40, tools=[WEATHER, TIME], tool_choice={"type": "tool", "name": "get_time"})


def test_tool_use_forced_with_any_and_by_name(client, named):
    m = create(client, max_tokens=40, tools=[WEATHER, TIME], tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert m.stop_reason == "tool_use", m
    calls = [b for b in m.content if b.type == "tool_use"]
    assert calls and calls[0].name in ("get_weather", "get_time") and calls[0].id.startswith("toolu_")
    assert isinstance(calls[0].input, dict) and calls[0].input
    assert named.stop_reason == "tool_use", named
    call = next(b for b in named.content if b.type == "tool_use")
    assert call.name == "get_time" and isinstance(call.input.get("tz"), str)
    # Streamed, the same call: arguments arrive as input_json_delta and accumulate to the same input.
    with client.messages.stream(model="auto", max_tokens=40, messages=ASK, tools=[WEATHER, TIME], extra_body=GREEDY,
                                tool_choice={"type": "tool", "name": "get_time"}) as s:
        kinds = {e.type for e in s}
        streamed = s.get_final_message()
    assert "input_json" in kinds
    assert without_ids(streamed) == without_ids(named)


def test_tool_result_sent_back_gets_an_answer(client, named):
    first = named
    call = next(b for b in first.content if b.type == "tool_use")
    m = create(client, max_tokens=10, tools=[WEATHER, TIME], messages=[
        *ASK, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "10:42"}]}])
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert any(b.type == "text" and b.text for b in m.content)
    assert prompt_of(m) > prompt_of(first)  # the call and its result were in the prompt


def test_count_tokens(client):
    short = client.messages.count_tokens(model="auto", messages=ASK)
    longer = client.messages.count_tokens(model="auto", messages=ASK, system="You are a terse meteorologist.",
                                          tools=[WEATHER])
    assert 5 < short.input_tokens < longer.input_tokens
    # Counted by the engine's /tokenize over the messages (and tools) through its chat template:
    # exactly the prompt the engine builds for the same request.
    m = create(client, max_tokens=1)
    assert short.input_tokens == prompt_of(m)


def test_claude_code_shaped_request(client):
    """What Claude Code sends (beta endpoint and headers, billing block, role: system message,
    metadata session, thinking and friends, a server tool), streamed."""
    meta = {"user_id": json.dumps({"device_id": "d1", "account_uuid": "", "session_id": "cc-sess-1"})}
    with client.beta.messages.stream(
        model="auto", max_tokens=32000, betas=["claude-code-20250219", "interleaved-thinking-2025-05-14"],
        system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328; cc_entrypoint=cli;"},
                {"type": "text", "text": "You are a helpful assistant.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
        tools=[WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
        metadata=meta, thinking={"type": "enabled", "budget_tokens": 1024}, output_config={"effort": "high"},
        extra_body={"context_management": {"edits": []}, **GREEDY},
        extra_headers={"X-Claude-Code-Session-Id": "cc-sess-1", "x-app": "cli"},
    ) as s:
        assert s.response.headers["x-switchyard-dropped-tools"] == "web_search"
        got = s.get_final_message()
    assert got.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert got.content and got.usage.output_tokens > 0


def test_errors_in_anthropic_shape(client):
    with pytest.raises(anthropic.NotFoundError) as e:
        create(client, model="claude-no-such-model")
    assert e.value.status_code == 404
    assert e.value.body["error"]["type"] == "not_found_error"
    assert e.value.body["error"]["message"].startswith("model: claude-no-such-model")
    with pytest.raises(anthropic.BadRequestError) as e:  # the SDK insists on max_tokens: a raw post
        client.post("/v1/messages", body={"model": "auto", "messages": ASK}, cast_to=anthropic.types.Message)
    assert e.value.status_code == 400
    assert e.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": "max_tokens: Field required"}}
    with pytest.raises(anthropic.BadRequestError, match="image"):
        create(client, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
