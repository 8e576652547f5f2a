"""The Responses dialect's translation, checked against the openai SDK's own types: requests
parsed into chat bodies, chat answers rendered, and recorded chat SSE streams translated with
the stream split at every byte boundary (validated event by event with the SDK's event union,
and accumulated by the SDK's own stream state machine)."""

from __future__ import annotations

import json

import orjson
import pytest
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from switchyard import errors
from switchyard.api.responses import ResponsesDialect

EVENTS = TypeAdapter(ResponseStreamEvent)
R = ResponsesDialect()

# What a chat upstream streams (our engine's shape): text in pieces, usage in its own last chunk.
TEXT_SSE = (
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant",'
    b'"content":"Hel"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"lo, '
    b'w\xc3\xb6rld"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},'
    b'"finish_reason":"stop"}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":12,'
    b'"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":8}}}\r\n\r\n'
    b"data: [DONE]\n\n"
)
# Two tool calls, their arguments in pieces (OpenAI's delta format), then finish_reason tool_calls.
TOOL_SSE = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,'
    b'"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": "}}]},'
    b'"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\\"Paris\\"}"}}]},'
    b'"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":'
    b'{"name":"get_time","arguments":"{}"}}]},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
    b"data: [DONE]\n\n"
)


def parsed(body: dict | None = None):
    return R.parse({"model": "auto", "input": "hi", "stream": True, **(body or {})}, {})


def sse_events(data: bytes) -> list[dict]:
    out = []
    for block in data.split(b"\n\n"):
        if not block.strip():
            continue
        lines = block.split(b"\n")
        assert lines[0].startswith(b"event: ") and lines[1].startswith(b"data: "), block
        obj = orjson.loads(lines[1][6:])
        assert lines[0][7:].decode() == obj["type"]
        out.append(obj)
    return out


def translate(sse: bytes, cut: int | None = None, body: dict | None = None) -> list[dict]:
    t = R.translator(parsed(body))
    parts = [sse] if cut is None else [sse[:cut], sse[cut:]]
    out = b"".join(t.feed(p) for p in parts) + t.close()
    return sse_events(out)


def accumulate(events: list[dict]) -> Response:
    """The SDK's own stream state machine over our events: it raises on an event out of place."""
    state = ResponseStreamState(input_tools=[], text_format=omit)
    final = None
    for e in events:
        ev = EVENTS.validate_python(e)  # every field the SDK's types require, with the right types
        for out in state.handle_event(ev):
            if out.type in ("response.completed", "response.incomplete"):
                final = out.response
    assert final is not None
    return final


def _shape(events: list[dict]) -> list[tuple]:
    """The stream without its random ids: (type, delta/text/arguments) in order."""
    return [(e["type"], e.get("delta") or e.get("text") or e.get("arguments")) for e in events]


def test_text_stream_events_in_order_and_deltas_add_up():
    events = translate(TEXT_SSE)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = accumulate(events)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == final.output_text == "Hello, wörld"
    assert final.status == "completed"
    assert final.usage.input_tokens == 12 and final.usage.output_tokens == 3 and final.usage.total_tokens == 15
    assert final.usage.input_tokens_details.cached_tokens == 8


def test_tool_call_stream():
    events = translate(TOOL_SSE, body={"tools": [{"type": "function", "name": "get_weather", "parameters": {}}]})
    final = accumulate(events)
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.call_id, c.name, json.loads(c.arguments)) for c in calls] == [
        ("call_a", "get_weather", {"city": "Paris"}), ("call_b", "get_time", {})]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [d["arguments"] for d in done] == ['{"city": "Paris"}', "{}"]
    assert final.usage is None  # the upstream reported none: none invented


@pytest.mark.parametrize("sse", [TEXT_SSE, TOOL_SSE], ids=["text", "tools"])
def test_stream_split_at_every_byte_boundary(sse):
    whole = _shape(translate(sse))
    for cut in range(1, len(sse)):
        assert _shape(translate(sse, cut)) == whole, cut


def test_stream_cut_at_max_output_tokens_is_incomplete():
    sse = TEXT_SSE.replace(b'"finish_reason":"stop"', b'"finish_reason":"length"')
    events = translate(sse)
    assert events[-1]["type"] == "response.incomplete"
    final = accumulate(events)
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"


def test_mid_stream_failure_is_an_error_event_then_response_failed():
    t = R.translator(parsed())
    out = t.feed(TEXT_SSE[:200]) + t.error("upstream r0 failed mid-stream: ClientPayloadError")
    events = sse_events(out)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    for e in events:
        EVENTS.validate_python(e)
    assert events[-1]["response"]["error"]["message"].startswith("upstream r0 failed")
    assert t.close() == b""  # nothing after the failure


def test_an_error_chunk_from_the_upstream_becomes_the_error_event():
    events = translate(b'data: {"error": {"message": "boom", "type": "upstream_error"}}\n\n')
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "error", "response.failed"]


def test_parse_maps_every_field():
    p = R.parse({
        "model": "auto", "instructions": "Be terse.", "max_output_tokens": 50, "temperature": 0.2, "top_p": 0.9,
        "stop": ["END"], "metadata": {"k": "v"}, "user": "u1", "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "name": "get_weather"}, "prompt_cache_key": "sess-1",
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "store": False,
        "client_metadata": {"x": 1},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
        "tools": [{"type": "function", "name": "get_weather", "description": "d", "strict": False,
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
                  {"type": "web_search"}, {"type": "namespace", "name": "multi_agent_v1", "tools": []}],
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev rules"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "reasoning", "id": "rs_1", "encrypted_content": "xx", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        ],
    }, {})
    assert p.session_hint == "sess-1" and p.dropped == ["web_search", "namespace:multi_agent_v1"]
    assert p.chat == {
        "model": "auto",
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "system", "content": "dev rules"},
            {"role": "user", "content": "a\nb"},
            {"role": "assistant", "content": "checking", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d", "strict": False,
                                                    "parameters": {"type": "object",
                                                                   "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"},
                                                                   "strict": True}},
        "max_tokens": 50, "temperature": 0.2, "top_p": 0.9, "stop": ["END"], "metadata": {"k": "v"}, "user": "u1",
    }
    assert p.ctx.store is False


@pytest.mark.parametrize("body, param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({}, "input"),
    ({"input": "x", "model": 3}, "model"),
])
def test_parse_refuses_what_it_cannot_translate(body, param):
    with pytest.raises(errors.BadRequest) as e:
        R.parse({"model": "auto", **body}, {})
    assert e.value.param == param


def test_render_validates_as_a_response():
    p = parsed({"tools": [{"type": "function", "name": "f", "parameters": {}}], "max_output_tokens": 5})
    answer = {"model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "sure",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}
    r = Response.model_validate(R.render(answer, p))
    assert r.status == "completed" and r.output_text == "sure" and r.max_output_tokens == 5
    assert [o.type for o in r.output] == ["message", "function_call"] and r.output[1].call_id == "call_1"
    answer["choices"][0]["finish_reason"] = "length"
    r = Response.model_validate(R.render(answer, p))
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_session_ids_of_agent_clients():
    from switchyard.gateway.routing import session_id_of

    body = {"metadata": {"session_id": "meta"}, "user": "u"}
    assert session_id_of(body, {"x-session-id": "explicit", "session-id": "codex"}, "hint") == "explicit"
    assert session_id_of(body, {"session-id": "codex"}, "hint") == "meta"
    assert session_id_of({"user": "u"}, {"session-id": "codex"}, "hint") == "hint"
    assert session_id_of({"user": "u"}, {"session-id": "codex", "thread-id": "t"}) == "codex"
    assert session_id_of({"user": "u"}, {"thread-id": "t"}) == "t"
    assert session_id_of({"user": "u"}, {"x-claude-code-session-id": "cc"}) == "cc"
    assert session_id_of({"user": "u"}, {}) == "u"
    long = session_id_of({}, {"session-id": "x" * 1000})
    assert long is not None and long.startswith("sha256:")
    # Codex: prompt_cache_key is the session hint of its Responses requests.
    assert R.parse({"model": "m", "input": "x", "prompt_cache_key": "codex-uuid"}, {}).session_hint == "codex-uuid"


def test_a_passed_through_stream_that_breaks_ends_with_openais_error_event():
    (event,) = sse_events(R.native_stream_error("upstream r0 failed mid-stream"))
    e = EVENTS.validate_python(event)
    assert e.type == "error" and e.message == "upstream r0 failed mid-stream"
