"""The Anthropic Messages dialect on its own: parse (Claude Code's real shape included), render,
the stream translator (fed split at every byte, read back by the anthropic SDK's own stream
parser through an in-process transport), and errors as the SDK's exception classes."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import orjson
import pytest

from switchyard.api import messages_render as mr
from switchyard.api.messages import MESSAGES, count_text, count_tokens_input, estimate_tokens
from switchyard.api.messages_stream import MAX_EVENT
from switchyard.errors import BadRequest, ContextTooLong

CC_SESSION = "3f7c2a9e-1b4d-4e8f-9a6b-2c5d8e1f4a7b"
BILLING = "x-anthropic-billing-header: cc_version=2.1.328.a1b; cc_entrypoint=sdk-cli; cch=8f2e1;"


def claude_code_body(**over: Any) -> dict:
    """The shape Claude Code 2.1 sends (/work/shared/agent-clients.md), trimmed."""
    body = {
        "model": "auto",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": BILLING},
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>Today is Tuesday.</system-reminder>"},
                {"type": "text", "text": "What is 2+2?", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "The user's working directory is /tmp/x."},
        ],
        "tools": [
            {"name": "Bash", "description": "Run a shell command.",
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                              "required": ["command"]}},
            {"name": "Read", "description": "Read a file.", "input_schema": {"type": "object"},
             "cache_control": {"type": "ephemeral"}, "defer_loading": False},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
            {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        ],
        "metadata": {"user_id": json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": CC_SESSION})},
        "thinking": {"type": "adaptive", "budget_tokens": 31999},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "service_tier": "auto",
    }
    body.update(over)
    return body


def parse(body: dict, headers: dict | None = None):
    return MESSAGES.parse(body, headers or {})


# --- parse ---

def test_claude_code_body_parses_to_chat_without_the_billing_header():
    p = parse(claude_code_body())
    chat = p.chat
    assert p.api == "messages" and p.stream is True
    assert p.session_hint == CC_SESSION
    assert p.dropped == ["web_search", "str_replace_based_edit_tool"]
    assert p.native["system"][0]["text"] == BILLING  # kept for a pool that speaks Messages
    assert BILLING not in orjson.dumps(chat).decode()
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code, Anthropic's official CLI for Claude.\n\nAnswer briefly."},
        {"role": "user", "content": "<system-reminder>Today is Tuesday.</system-reminder>\n\nWhat is 2+2?"},
        {"role": "system", "content": "The user's working directory is /tmp/x."},
    ]
    assert [t["function"]["name"] for t in chat["tools"]] == ["Bash", "Read"]
    assert chat["tools"][0] == {"type": "function", "function": {
        "name": "Bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
    assert chat["max_tokens"] == 32000 and chat["stream"] is True
    assert "stream_options" not in chat  # dispatch adds it where the pool's server takes it
    for ignored in ("thinking", "context_management", "output_config", "service_tier", "metadata", "system"):
        assert ignored not in chat
    assert "user" not in chat  # the JSON user_id is Claude Code's session, not an end-user id


def test_the_billing_header_alone_leaves_no_system_message():
    p = parse({"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": BILLING}],
               "messages": [{"role": "user", "content": "hi"}]})
    assert p.chat["messages"] == [{"role": "user", "content": "hi"}]
    assert "stream" not in p.chat and p.stream is False


def test_session_hint_from_the_header_and_plain_user_id():
    p = parse({"model": "m", "max_tokens": 5, "metadata": {"user_id": "alice"},
               "messages": [{"role": "user", "content": "hi"}]}, {"x-claude-code-session-id": "s-1"})
    assert p.chat["user"] == "alice" and p.session_hint == "s-1"


def test_tool_use_and_tool_results_map_to_chat_calls_and_tool_messages():
    body = {"model": "m", "max_tokens": 50, "system": "Be terse.", "messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "two calls", "signature": "sig"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_02", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18C"},
            {"type": "tool_result", "tool_use_id": "toolu_02", "is_error": True,
             "content": [{"type": "text", "text": "timeout"}, {"type": "text", "text": "retry later"}]},
            {"type": "text", "text": "Summarise."}]},
    ]}
    assert parse(body).chat["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_01", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "toolu_02", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_01", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_02", "content": "Error: timeout\n\nretry later"},
        {"role": "user", "content": "Summarise."},
    ]


def test_claude_codes_tool_search_references_read_as_text():
    p = parse({"model": "m", "max_tokens": 5, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_s", "name": "ToolSearch",
                                           "input": {"query": "notebook"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s", "content": [
            {"type": "tool_reference", "tool_name": "NotebookEdit"}, {"type": "tool_reference", "tool_name": "X"}]}]}]})
    assert p.chat["messages"][1] == {"role": "tool", "tool_call_id": "toolu_s",
                                     "content": "Tool loaded: NotebookEdit\n\nTool loaded: X"}


@pytest.mark.parametrize(("choice", "want", "parallel"), [
    ({"type": "auto"}, "auto", None),
    ({"type": "any"}, "required", None),
    ({"type": "none"}, "none", None),
    ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}, None),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
])
def test_tool_choice(choice, want, parallel):
    p = parse({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
               "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": choice})
    assert p.chat["tool_choice"] == want
    assert p.chat.get("parallel_tool_calls") == parallel


def test_sampling_fields_pass_as_chat_fields():
    p = parse({"model": "m", "max_tokens": 7, "messages": [{"role": "user", "content": "x"}],
               "temperature": 0, "top_p": 0.9, "top_k": 40, "stop_sequences": ["END", "\n\n"]})
    c = p.chat
    assert (c["temperature"], c["top_p"], c["top_k"], c["stop"], c["max_tokens"]) == (0, 0.9, 40, ["END", "\n\n"], 7)


@pytest.mark.parametrize(("body", "says"), [
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model: Field required"),
    ({"model": "m", "max_tokens": 5}, "messages: Field required"),
    ({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Input should"),
    ({"model": "m", "max_tokens": "9", "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Input should"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "see"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]}]},
     "messages.0.content.1: content blocks of type 'image'"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document", "source": {}}]}]}]},
     "messages.0.content.0.content.0: content blocks of type 'document'"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"name": "f"}]}, "tools.0.custom.input_schema: Field required"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}],
      "tool_choice": {"type": "tool", "name": "web_search"}}, "server tool"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
     "stream: Input should be a valid boolean"),
    ([1, 2], "JSON object"),
])
def test_bad_requests_are_400s_that_say_what(body, says):
    with pytest.raises(BadRequest) as e:
        parse(body)
    assert says in e.value.message
    err = orjson.loads(MESSAGES.error_body(400, e.value.type, e.value.message, e.value.param, e.value.code))
    assert err == {"type": "error", "error": {"type": "invalid_request_error", "message": e.value.message}}


def test_deep_and_wide_bodies_are_walked_without_recursion():
    deep: Any = "leaf"
    for _ in range(150):
        deep = {"a": deep}
    many = [{"role": "user", "content": [{"type": "text", "text": str(i)} for i in range(200)]}] * 50
    p = parse({"model": "m", "max_tokens": 5, "messages": [
        *many, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": deep}]}]})
    assert len(p.chat["messages"]) == 51
    assert json.loads(p.chat["messages"][-1]["tool_calls"][0]["function"]["arguments"]) == deep


def test_count_tokens_input_needs_no_max_tokens():
    p = count_tokens_input({"model": "auto", "system": "sys", "messages": [{"role": "user", "content": "hello"}],
                            "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]})
    assert "max_tokens" not in p.chat
    text = count_text(p.chat)
    assert "sys" in text and "hello" in text and '"name":"f"' in text
    assert estimate_tokens(p.chat) >= len(text) // 4
    with pytest.raises(BadRequest, match="messages: Field required"):
        count_tokens_input({"model": "auto"})


# --- answers: one spec -> the chat.completion and its SSE stream --------------------------------

def chat_answer(text: str = "", calls: list[tuple[str, str, str]] = (), finish: str = "stop",
                prompt: int = 20, completion: int = 5, cached: int = 0, stop_reason: Any = None,
                cid: str = "chatcmpl-abc123", arg_piece: int = 4) -> tuple[dict, bytes]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": cached}}
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                             for i, n, a in calls]
    choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": finish}
    if stop_reason is not None:
        choice["stop_reason"] = stop_reason
    body = {"id": cid, "object": "chat.completion", "model": "up", "choices": [choice], "usage": usage}

    def chunk(delta: dict, fin: str | None = None, **extra: Any) -> bytes:
        ch = {"index": 0, "delta": delta, "finish_reason": fin, **extra}
        return b"data: " + orjson.dumps({"id": cid, "object": "chat.completion.chunk", "choices": [ch]}) + b"\n\n"

    sse = [chunk({"role": "assistant", "content": ""})]
    for k in range(0, len(text), 3):
        sse.append(chunk({"content": text[k:k + 3]}))
    for idx, (i, n, a) in enumerate(calls):
        sse.append(chunk({"tool_calls": [{"index": idx, "id": i, "type": "function",
                                          "function": {"name": n, "arguments": ""}}]}))
        for k in range(0, len(a), arg_piece):
            sse.append(chunk({"tool_calls": [{"index": idx, "function": {"arguments": a[k:k + arg_piece]}}]}))
    extra = {"stop_reason": stop_reason} if stop_reason is not None else {}
    sse.append(chunk({}, finish, **extra))
    sse.append(b"data: " + orjson.dumps({"id": cid, "choices": [], "usage": usage}) + b"\n\n")
    sse.append(b"data: [DONE]\n\n")
    return body, b"".join(sse)


ANSWERS = {
    "text": chat_answer("The answer is 4, of course."),
    "cached": chat_answer("Hi!", prompt=100, cached=64),
    "length": chat_answer("cut off he", finish="length"),
    "stop_sequence": chat_answer("one two", stop_reason="END"),
    "tools": chat_answer("Let me look.", [("call_1", "get_weather", '{"city": "Paris", "unit": "c"}'),
                                          ("call_2", "get_time", '{"tz": "Europe/Paris"}')], "tool_calls",
                         cached=8),
    "tool_only": chat_answer("", [("toolu_9", "Bash", '{"command": "ls -la"}')], "tool_calls"),
    "bad_args": chat_answer("", [("call_x", "Bash", '{"command": ls')], "tool_calls"),
    "empty_args": chat_answer("", [("call_y", "now", "")], "tool_calls"),
}
REQ = {"model": "claude-sonnet-4-5", "max_tokens": 100, "stop_sequences": ["END"],
       "messages": [{"role": "user", "content": "hi"}]}


def test_render_text_usage_and_stop_reasons():
    p = parse(REQ)
    m = mr.render(ANSWERS["cached"][0], p)
    assert m == {"id": "msg_abc123", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                 "content": [{"type": "text", "text": "Hi!"}], "stop_reason": "end_turn", "stop_sequence": None,
                 "usage": {"input_tokens": 36, "output_tokens": 5, "cache_creation_input_tokens": 0,
                           "cache_read_input_tokens": 64}}
    assert mr.render(ANSWERS["length"][0], p)["stop_reason"] == "max_tokens"
    s = mr.render(ANSWERS["stop_sequence"][0], p)
    assert (s["stop_reason"], s["stop_sequence"]) == ("stop_sequence", "END")


def test_render_tool_calls():
    m = mr.render(ANSWERS["tools"][0], parse(REQ))
    assert m["stop_reason"] == "tool_use"
    assert m["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "unit": "c"}},
        {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {"tz": "Europe/Paris"}}]
    assert mr.render(ANSWERS["tool_only"][0], parse(REQ))["content"] == [
        {"type": "tool_use", "id": "toolu_9", "name": "Bash", "input": {"command": "ls -la"}}]
    # Arguments that are not a JSON object: input {} (Anthropic's input is always an object).
    assert mr.render(ANSWERS["bad_args"][0], parse(REQ))["content"][0]["input"] == {}
    assert mr.render(ANSWERS["empty_args"][0], parse(REQ))["content"][0]["input"] == {}


def translate(sse: bytes, cuts: list[int], body: dict = REQ) -> bytes:
    t = MESSAGES.translator(parse({**body, "stream": True}))
    out, last = [], 0
    for c in [*cuts, len(sse)]:
        out.append(t.feed(sse[last:c]))
        last = c
    out.append(t.close())
    return b"".join(out)


@pytest.mark.parametrize("name", list(ANSWERS))
def test_stream_is_the_same_split_at_every_byte(name):
    sse = ANSWERS[name][1]
    whole = translate(sse, [])
    assert whole.endswith(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
    for k in range(1, len(sse)):
        assert translate(sse, [k]) == whole, k
    assert translate(sse, list(range(1, len(sse)))) == whole  # a byte at a time
    crlf = sse.replace(b"\n", b"\r\n")
    assert translate(crlf, list(range(0, len(crlf), 7))) == whole


def sdk_client(handler) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="k", base_url="http://gw.test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def serving(name: str, cuts: int = 5):
    """An in-process server: the dialect over the canned answer, as the gateway would serve it."""
    def handler(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        parsed = MESSAGES.parse(body, request.headers)
        answer, sse = ANSWERS[name]
        if not parsed.stream:
            return httpx2.Response(200, json=MESSAGES.render(answer, parsed))
        step = max(1, len(sse) // cuts)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                               content=translate(sse, list(range(step, len(sse), step)), body))
    return handler


@pytest.mark.parametrize("name", list(ANSWERS))
def test_the_sdk_accumulates_the_stream_to_the_non_stream_message(name):
    c = sdk_client(serving(name))
    want = c.messages.create(**REQ)
    with c.messages.stream(**REQ) as s:
        events = [e.type for e in s]
        got = s.get_final_message()
    assert got.model_dump() == want.model_dump()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    if want.content and want.content[0].type == "text":
        assert "text" in events  # the SDK's own text events: it read our text_deltas


def test_stream_events_in_anthropic_order():
    out = translate(ANSWERS["tools"][1], [])
    names = [line[7:] for line in out.decode().splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 3
    datas = [json.loads(line[6:]) for line in out.decode().splitlines() if line.startswith("data: ")]
    starts = [d for d in datas if d["type"] == "content_block_start"]
    assert [d["index"] for d in starts] == [0, 1, 2]
    assert starts[1]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    jd = [d["delta"]["partial_json"] for d in datas if d["type"] == "content_block_delta"
          and d["delta"]["type"] == "input_json_delta"]
    assert [json.loads(j) for j in jd] == [{"city": "Paris", "unit": "c"}, {"tz": "Europe/Paris"}]
    md = next(d for d in datas if d["type"] == "message_delta")
    assert md == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                  "usage": {"input_tokens": 12, "output_tokens": 5, "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 8}}


def test_a_failure_mid_stream_is_an_error_event_the_sdk_raises():
    sse = ANSWERS["text"][1]
    t = MESSAGES.translator(parse({**REQ, "stream": True}))
    head = t.feed(sse[:200])
    tail = t.error("upstream r0 failed mid-stream: ClientPayloadError")
    assert tail.startswith(b"event: error\ndata: ")
    assert json.loads(tail.split(b"data: ", 1)[1]) == {
        "type": "error", "error": {"type": "api_error", "message": "upstream r0 failed mid-stream: ClientPayloadError"}}
    assert t.feed(sse[200:]) == b"" and t.close() == b""  # nothing after the error

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=head + tail)

    with pytest.raises(anthropic.APIStatusError, match="failed mid-stream"), \
            sdk_client(handler).messages.stream(**REQ) as s:
        for _ in s:
            pass


def test_a_passed_through_stream_that_breaks_ends_in_anthropics_error_event():
    # A pool that serves Messages itself: its bytes go to the client untouched, so a cut needs
    # the dialect's own error event (not the chat-style one the relay writes by default).
    tail = MESSAGES.native_stream_error("upstream n0 failed mid-stream: ClientPayloadError")
    assert tail.startswith(b"event: error\ndata: ")
    assert json.loads(tail.split(b"data: ", 1)[1]) == {
        "type": "error", "error": {"type": "api_error", "message": "upstream n0 failed mid-stream: ClientPayloadError"}}

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=tail)

    with pytest.raises(anthropic.APIStatusError, match="failed mid-stream"), \
            sdk_client(handler).messages.stream(**REQ) as s:
        for _ in s:
            pass


def test_an_upstream_error_chunk_becomes_an_error_event():
    err = b'data: {"error": {"message": "the engine failed: CUDA error", "type": "server_error", "code": null}}\n\n'
    first_two = b"\n\n".join(ANSWERS["text"][1].split(b"\n\n")[:2]) + b"\n\n"
    out = translate(first_two + err, [])
    assert out.count(b"event: error") == 1 and b"message_stop" not in out
    assert b"the engine failed: CUDA error" in out


def test_crlf_events_split_at_every_byte_and_a_long_event_in_tiny_pieces():
    sse = ANSWERS["tool_only"][1]
    whole = translate(sse, [])
    crlf = sse.replace(b"\n", b"\r\n")
    for k in range(1, len(crlf)):
        assert translate(crlf, [k]) == whole, k
    # One ~200 KB event (a long tool argument) arriving 7 bytes at a time: the same answer.
    big = "x" * 200_000
    body, sse = chat_answer("", [("call_big", "Write", json.dumps({"content": big}))], "tool_calls",
                            arg_piece=1 << 20)
    t = MESSAGES.translator(parse({**REQ, "stream": True}))
    out = b"".join(t.feed(sse[i:i + 7]) for i in range(0, len(sse), 7)) + t.close()
    assert out == translate(sse, [])
    deltas = [json.loads(line[6:]) for line in out.decode().splitlines() if "input_json_delta" in line]
    assert [json.loads(d["delta"]["partial_json"]) for d in deltas] == [{"content": big}]


def test_comments_event_names_and_multiline_data_are_read_as_sse():
    body, sse = chat_answer("ok")
    first, rest = sse.split(b"\n\n", 1)
    odd = b": keep-alive\n\nevent: chunk\nid: 1\n" + first + b"\n\n" + rest
    assert translate(odd, []) == translate(sse, [])


def test_a_stream_without_done_or_usage_still_closes():
    body, sse = chat_answer("abc def")
    cut = sse[:sse.index(b'data: {"id":"chatcmpl-abc123","choices":[]')]  # no usage chunk, no [DONE]
    out = translate(cut, [])
    md = next(json.loads(line[6:]) for line in out.decode().splitlines() if '"message_delta"' in line)
    assert md["delta"]["stop_reason"] == "end_turn" and md["usage"] == {"output_tokens": 3}
    assert out.endswith(b'{"type":"message_stop"}\n\n')


def test_an_oversized_upstream_event_fails_the_stream():
    t = MESSAGES.translator(parse({**REQ, "stream": True}))
    out = t.feed(b"data: " + b"x" * (MAX_EVENT + 10))
    assert out.startswith(b"event: error") and t.close() == b""


# --- errors ---

def test_the_gateways_own_context_error_in_claude_codes_wording():
    e = ContextTooLong(12400, 8192, 256)
    obj = orjson.loads(MESSAGES.error_body(400, e.type, e.message, e.param, e.code))
    assert obj == {"type": "error", "error": {"type": "invalid_request_error",
                                              "message": "prompt is too long: 12400 tokens > 7936 maximum"}}


@pytest.mark.parametrize(("status", "kind", "message", "param", "code", "sdk_error", "want_status", "want"), [
    (404, "invalid_request_error",
     "the model 'claude-opus-9' does not exist here; GET /v1/models lists policies, pools and upstream models",
     "model", "model_not_found", anthropic.NotFoundError, 404, ("not_found_error", "model: claude-opus-9")),
    (401, "invalid_request_error", "invalid API key", None, "invalid_api_key", anthropic.AuthenticationError, 401,
     ("authentication_error", "invalid API key")),
    (403, "permission_error", "key k1 may not use pool large", None, None, anthropic.PermissionDeniedError, 403,
     ("permission_error", "key k1")),
    (413, "invalid_request_error", "request body is larger than 1048576 bytes", None, "request_too_large",
     anthropic.APIStatusError, 413, ("request_too_large", "larger than")),
    (429, "tokens", "key k1 is over 1000 tokens per minute", None, "rate_limit_exceeded", anthropic.RateLimitError,
     429, ("rate_limit_error", "tokens per minute")),
    (429, "rate_limit_error", "every replica of pool small is busy", None, "no_capacity", anthropic.APIStatusError,
     529, ("overloaded_error", "busy")),
    (503, "service_unavailable", "no healthy replica in pool small", None, "no_healthy_replica",
     anthropic.APIStatusError, 529, ("overloaded_error", "no healthy replica")),
    (502, "upstream_error", "upstream r0 failed", None, "upstream_error", anthropic.InternalServerError, 502,
     ("api_error", "upstream r0 failed")),
    (400, "invalid_request_error",
     "This model's maximum context length is 8192 tokens. However, your request has 12001 input tokens. "
     "Please reduce the length of the input.", "messages", "context_length_exceeded", anthropic.BadRequestError,
     400, ("invalid_request_error", "prompt is too long: 12001 tokens > 8192 maximum")),
    (400, "invalid_request_error",
     "This model's maximum context length is 2048 tokens. However, you requested 32100 tokens (100 in the input, "
     "32000 in the completion). Please reduce the length of the input or the completion.", "max_tokens",
     "context_length_exceeded", anthropic.BadRequestError, 400,
     ("invalid_request_error", "input length and `max_tokens` exceed context limit: 100 + 32000 > 2048")),
])
def test_errors_in_anthropic_shape_read_by_the_sdk(status, kind, message, param, code, sdk_error, want_status, want):
    out_status = MESSAGES.status(status, kind, code)
    assert out_status == want_status
    body = MESSAGES.error_body(status, kind, message, param, code)
    obj = orjson.loads(body)
    assert obj["type"] == "error" and obj["error"]["type"] == want[0]
    assert obj["error"]["message"].startswith(want[1]) or want[1] in obj["error"]["message"]

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(out_status, content=body, headers={"content-type": "application/json"})

    with pytest.raises(sdk_error) as e:
        sdk_client(handler).messages.create(**REQ)
    assert e.value.status_code == want_status
    assert e.value.body["error"]["type"] == want[0]


# --- never a crash: every field of a realistic body (and answer) swapped for each JSON kind -------

ODD = [None, True, 0, -1, 1.5, "", "s", [], [1], ["s"], {}, {"type": "text"}, {"type": "image"}, [{}], [None]]


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*path, i))
    return out


def _swapped(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _swapped(value[path[0]], path[1:], new)
    return copy


def test_any_field_of_any_kind_parses_or_is_a_400():
    body = claude_code_body(messages=[
        *claude_code_body()["messages"],
        {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False,
                                      "content": [{"type": "text", "text": "a.txt"}]}]}],
        tool_choice={"type": "tool", "name": "Bash", "disable_parallel_tool_use": True}, stop_sequences=["X"],
        temperature=0.5, top_p=0.9, top_k=5)
    parse(body)
    tried = 0
    for path in _paths(body)[1:]:
        for new in ODD:
            b = _swapped(body, path, new)
            try:
                p = parse(b)
            except BadRequest:
                continue
            orjson.dumps(p.chat)  # what goes upstream always encodes
            tried += 1
    assert tried > 100


def test_any_answer_field_of_any_kind_renders_and_streams():
    p = parse({**REQ, "stream": True})
    answer, sse = ANSWERS["tools"]
    for path in _paths(answer)[1:]:
        for new in ODD:
            m = mr.render(_swapped(answer, path, new), p)
            assert m["type"] == "message" and isinstance(m["content"], list)
    events = sse.split(b"\n\n")[:-1]
    for i, ev in enumerate(events):
        obj = orjson.loads(ev[6:]) if ev != b"data: [DONE]" else None
        for path in _paths(obj)[1:] if obj is not None else []:
            for new in ODD:
                bad = b"data: " + orjson.dumps(_swapped(obj, path, new))
                stream = b"\n\n".join([*events[:i], bad, *events[i + 1:]]) + b"\n\n"
                t = MESSAGES.translator(p)
                out = t.feed(stream) + t.close()
                assert out.endswith(b'{"type":"message_stop"}\n\n') or b"event: error" in out
