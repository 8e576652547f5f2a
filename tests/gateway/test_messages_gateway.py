"""Anthropic Messages through a real gateway process over fake chat upstreams (tests/fake_upstream.py):
the gateway's own failures in Anthropic's shape as the anthropic SDK raises them (a busy pool's 529
with retry-after, a replica dying mid-stream ending in an error event, an upstream's 400 re-rendered
in Claude Code's wording) and what the upstream said reaching the client translated."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import anthropic
import pytest
from gwkit import make_cluster, stop_cluster

ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture
def own(tmp_path):
    made = []

    def make(**kw):
        c = make_cluster(tmp_path, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        stop_cluster(c)


def client(c) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=c.url, api_key="unused", max_retries=0, timeout=30)


def test_translated_answers_usage_and_tool_calls(own):
    c = own()
    c.control("s0", cached_tokens=3)
    c.control("s1", cached_tokens=3)
    raw = client(c).messages.with_raw_response.create(model="small", max_tokens=5, messages=ASK,
                                                      stop_sequences=["END"])
    m = raw.parse()
    seen = c.upstream_state(raw.headers["x-switchyard-replica"])
    assert seen["last_path"].endswith("/chat/completions")  # a chat-only pool: translated
    assert seen["last_body"]["messages"] == ASK and seen["last_body"]["stop"] == ["END"]
    assert m.content[0].type == "text" and m.content[0].text
    assert (m.usage.input_tokens, m.usage.cache_read_input_tokens, m.usage.output_tokens) == (7, 3, 5)
    # Streamed: the gateway asks the upstream for its usage chunk, which message_delta carries.
    with client(c).messages.stream(model="small", max_tokens=5, messages=ASK) as st:
        streamed = st.get_final_message()
    assert streamed.content[0].text == "tok0 tok1 tok2 tok3 tok4 " and streamed.stop_reason == "end_turn"
    assert (streamed.usage.input_tokens, streamed.usage.cache_read_input_tokens, streamed.usage.output_tokens) == (
        7, 3, 5)
    for name in ("s0", "s1"):
        c.control(name, tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})
    m = client(c).messages.create(
        model="small", max_tokens=20, messages=ASK, tool_choice={"type": "any"},
        tools=[{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])
    assert m.stop_reason == "tool_use"
    assert [(b.type, b.id, b.name, b.input) for b in m.content] == [("tool_use", "toolu_1", "get_weather",
                                                                      {"city": "Paris"})]


@pytest.mark.slow  # seconds of waiting or load by design: `make test`
def test_a_busy_pool_is_529_overloaded_with_retry_after(own):
    c = own(max_inflight=1, queue_size=1)
    c.control("s0", delay_ms=1500)
    c.control("s1", delay_ms=1500)
    c.control("l0", fail=503)  # the fallback pool cannot help either

    def ask() -> anthropic.types.Message:
        return client(c).messages.create(model="small", max_tokens=5, messages=ASK)

    with ThreadPoolExecutor(6) as ex:
        errs = [f.exception() for f in [ex.submit(ask) for _ in range(6)]]
    over = [e for e in errs if isinstance(e, anthropic.OverloadedError)]
    assert over, errs
    assert over[0].status_code == 529 and over[0].body["error"]["type"] == "overloaded_error"
    assert int(over[0].response.headers["retry-after"]) >= 1
    assert sum(e is None for e in errs) >= 2  # the two replicas each served one


def test_a_replica_dying_mid_stream_ends_in_an_error_event(own):
    c = own()
    for name in ("s0", "s1", "l0"):
        c.control(name, die_midstream=True, die_after_chunks=2, chunk_delay_ms=30)
    text = []
    with pytest.raises(anthropic.APIStatusError) as e, \
            client(c).messages.stream(model="small", max_tokens=5, messages=ASK) as s:
        for piece in s.text_stream:
            text.append(piece)
    assert "".join(text) == "tok0 tok1 "  # what came before the cut reached the client
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "api_error"
    assert "mid-stream" in e.value.body["error"]["message"]


def test_an_upstream_context_error_reads_as_claude_codes_prompt_too_long(own):
    c = own()
    msg = ("This model's maximum context length is 2048 tokens. However, your request has 5000 input tokens. "
           "Please reduce the length of the input.")
    for name in ("s0", "s1", "l0"):
        c.control(name, fail=400, fail_message=msg)
    with pytest.raises(anthropic.BadRequestError) as e:
        client(c).messages.create(model="small", max_tokens=5, messages=ASK)
    assert e.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": "prompt is too long: 5000 tokens > 2048 maximum"}}


def test_the_edges_own_refusals_in_anthropics_shape(own):
    # The edge guard answers before any handler (a body over the limit, a Host that is not
    # served): on /v1/messages in Anthropic's shape, as Claude Code parses it.
    import httpx

    c = own()
    import json
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(c.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:  # a Content-Length no client sends
        s.sendall(b"POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 67108864\r\nConnection: close\r\n\r\n{}")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(body)["type"] == "error" and json.loads(body)["error"]["type"] == "request_too_large"
    host = httpx.post(c.url + "/v1/messages", json={"model": "small", "max_tokens": 5, "messages": ASK},
                      headers={"host": "evil.example"})
    assert host.status_code == 403 and host.json()["error"]["type"] == "permission_error"
    chat = httpx.post(c.url + "/v1/chat/completions", json={"model": "small", "messages": ASK},
                      headers={"host": "evil.example"})
    assert chat.status_code == 403 and chat.json()["error"]["code"] == "host_not_allowed"  # OpenAI's envelope
