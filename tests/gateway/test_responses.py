"""POST/GET/DELETE /v1/responses through a real gateway process in front of test upstreams, with
the official openai SDK as the client: what the chat upstream receives, what the client gets back,
stored responses and their chains, errors in OpenAI's envelope, and pass-through to a pool that
serves the Responses API itself."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import orjson
import pytest
from procs import ROOT, http_post, start_gateway, start_upstream


def client(c, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=c.url + "/v1", api_key="unused", max_retries=0, **kw)


def seen(c, replica: str) -> dict:
    return c.upstream_state(replica)["last_body"]


def test_create_translates_to_chat_and_back(fresh):
    raw = client(fresh).responses.with_raw_response.create(
        model="auto", instructions="Be brief.", input="hello", max_output_tokens=20, temperature=0.3,
        metadata={"team": "a"}, reasoning={"summary": "auto"}, include=["reasoning.encrypted_content"])
    r = raw.parse()
    assert raw.headers["x-switchyard-pool"] == "small" and raw.headers["x-switchyard-rule"] == "default"
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    assert r.output_text.endswith("echoes: hello")
    assert r.usage.input_tokens == 10 and r.usage.output_tokens == 5 and r.usage.total_tokens == 15
    assert r.instructions == "Be brief." and r.max_output_tokens == 20 and r.metadata == {"team": "a"}
    body = seen(fresh, raw.headers["x-switchyard-replica"])
    assert body["model"] == "small-model"
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    assert body["max_tokens"] == 20 and body["temperature"] == 0.3 and body["metadata"] == {"team": "a"}
    assert "reasoning" not in body and "include" not in body and "input" not in body


def test_stream_events_in_order_and_deltas_add_up(fresh):
    events = []
    with client(fresh).responses.stream(model="auto", input="hi") as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == "tok0 tok1 tok2 tok3 tok4 "
    assert final.usage is not None and final.usage.total_tokens == 15  # the gateway asked for the stream's usage


def test_forced_function_call_then_its_output_answers(fresh):
    for name in ("s0", "s1"):
        fresh.control(name, tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})
    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    c = client(fresh)
    raw = c.responses.with_raw_response.create(model="auto", input="weather in Paris?", tools=tools,
                                               tool_choice={"type": "function", "name": "get_weather"})
    r = raw.parse()
    call = next(o for o in r.output if o.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"} and call.call_id
    body = seen(fresh, raw.headers["x-switchyard-replica"])
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["tools"][0]["function"]["name"] == "get_weather"
    for name in ("s0", "s1"):
        fresh.control(name, tool_call=None)
    raw2 = c.responses.with_raw_response.create(
        model="auto", previous_response_id=r.id, tools=tools, tool_choice="required",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C and sunny"}])
    assert raw2.parse().output_text
    body = seen(fresh, raw2.headers["x-switchyard-replica"])
    assert body["tool_choice"] == "required"
    assert body["messages"] == [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "18C and sunny"},
    ]


def test_store_retrieve_delete_and_unknown_ids(fresh):
    c = client(fresh)
    first = c.responses.create(model="auto", input="one")
    assert c.responses.retrieve(first.id).output_text == first.output_text
    second = c.responses.create(model="auto", input="two", previous_response_id=first.id, instructions="New rules.")
    assert c.responses.retrieve(second.id).previous_response_id == first.id
    items = list(c.responses.input_items.list(second.id, order="asc"))  # its own input, not the chain's
    assert [(i.type, i.role, i.content[0].text) for i in items] == [("message", "user", "two")]
    c.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.retrieve(second.id)
    assert e.value.body["message"] == f"Response with id '{second.id}' not found."
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="auto", input="x", previous_response_id="resp_never")
    assert e.value.body["message"] == "Previous response with id 'resp_never' not found."
    assert e.value.body["param"] == "previous_response_id"
    unstored = c.responses.create(model="auto", input="private", store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


def test_a_chain_is_one_session(tmp_path):
    """session.pin: replica keeps a previous_response_id chain on the replica its first turn used."""
    ups = {n: start_upstream(tmp_path, n) for n in ("a", "b")}
    pol = tmp_path / "pin.yaml"
    pol.write_text(f"""
version: 1
name: pin
pools:
  p:
    model: m
    strategy: round_robin
    replicas: [{{url: '{ups['a'][1]}/v1', name: a}}, {{url: '{ups['b'][1]}/v1', name: b}}]
session: {{pin: replica}}
routes: [{{name: default, pool: p}}]
""")
    gw, url = start_gateway(tmp_path, [pol])
    try:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        prev = c.responses.create(model="auto", input="start").id
        replicas = []
        for i in range(4):  # round_robin alone would alternate between a and b
            raw = c.responses.with_raw_response.create(model="auto", input=f"turn {i}", previous_response_id=prev)
            prev = raw.parse().id
            replicas.append(raw.headers["x-switchyard-replica"])
        # Every chained turn carries the chain's root id as its session: pinned from the second turn on.
        assert len(set(replicas)) == 1, replicas
    finally:
        gw.stop()
        for p, _ in ups.values():
            p.stop()


def test_hosted_tools_are_dropped_and_named(fresh):
    raw = client(fresh).responses.with_raw_response.create(
        model="auto", input="search the web",
        tools=[{"type": "web_search"},
               {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}])
    assert raw.headers["x-switchyard-dropped-tools"] == "web_search"
    body = seen(fresh, raw.headers["x-switchyard-replica"])
    assert [t["function"]["name"] for t in body["tools"]] == ["exec_command"]
    assert [t.type for t in raw.parse().tools] == ["function"]


def test_errors_are_openai_envelopes(fresh):
    c = client(fresh)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="auto", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/cat.png"}]}])
    assert "input_image" in e.value.body["message"] and e.value.body["type"] == "invalid_request_error"
    assert e.value.body["param"] == "input[0].content[0].type"
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="no-such-model", input="x")
    assert e.value.body["param"] == "model"
    status, raw = http_post(fresh.url + "/v1/responses", b"{not json")
    assert status == 400 and set(orjson.loads(raw)["error"]) == {"message", "type", "param", "code"}
    for name in ("s0", "s1", "l0"):  # an upstream's own 4xx comes back in the same envelope
        fresh.control(name, fail=422, fail_message="bad sampling settings")
    with pytest.raises(openai.UnprocessableEntityError) as e:
        c.responses.create(model="auto", input="x")
    assert e.value.body["message"] == "bad sampling settings"


def test_responses_visible_only_to_the_key_that_made_them(tmp_path):
    up, uurl = start_upstream(tmp_path, "u")
    pol = tmp_path / "p.yaml"
    pol.write_text(f"version: 1\nname: p\npools:\n  small:\n    model: m\n    replicas: [{{url: '{uurl}/v1'}}]\n"
                   "routes: [{name: default, pool: small}]\n")
    keys = tmp_path / "keys.json"
    made = [subprocess.run([sys.executable, "-m", "switchyard.cli", "keys", "create", "--name", n, "--keys-file",
                            str(keys)], capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()[0]
            for n in ("alice", "bob")]
    gw, url = start_gateway(tmp_path, [pol], "--auth", "--keys-file", str(keys))
    try:
        alice, bob = (openai.OpenAI(base_url=url + "/v1", api_key=k, max_retries=0) for k in made)
        r = alice.responses.create(model="auto", input="mine")
        assert alice.responses.retrieve(r.id).id == r.id
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(r.id)
        with pytest.raises(openai.NotFoundError):
            bob.responses.create(model="auto", input="x", previous_response_id=r.id)
        with pytest.raises(openai.NotFoundError):
            bob.responses.delete(r.id)
        assert httpx.get(url + f"/v1/responses/{r.id}", timeout=5).status_code == 401
        alice.responses.delete(r.id)
    finally:
        gw.stop()
        up.stop()


def test_pass_through_to_a_pool_that_speaks_responses(tmp_path):
    native, nurl = start_upstream(tmp_path, "native")  # it serves /v1/responses too
    chat, curl = start_upstream(tmp_path, "chat")
    pol = tmp_path / "pt.yaml"
    pol.write_text(f"""
version: 1
name: pt
pools:
  native:
    model: native-model
    api: [chat, responses]
    price: {{prompt: 1.0, completion: 2.0}}
    circuit: {{failures: 100}}
    replicas: [{{url: '{nurl}/v1', name: native}}]
  chatonly:
    model: chat-model
    replicas: [{{url: '{curl}/v1', name: chat}}]
routes:
  - {{name: default, pool: native}}
fallback: {{native: [chatonly]}}
""")
    gw, url = start_gateway(tmp_path, [pol])
    try:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        body = {"model": "auto", "input": "hi", "reasoning": {"effort": "low"}, "store": False}
        r = httpx.post(url + "/v1/responses", json=body, timeout=10)
        assert r.status_code == 200 and r.headers["x-switchyard-pool"] == "native"
        got = httpx.get(nurl + "/_state", timeout=5).json()
        assert got["last_path"] == "/v1/responses"
        assert got["last_body"] == {**body, "model": "native-model"}  # untranslated, model rewritten
        assert r.json()["object"] == "response" and r.json()["id"].startswith("resp_native")
        # Its usage, in the Responses API's own names, is still counted: 7 input and 3 output tokens.
        assert r.headers["x-switchyard-cost-usd"] == f"{(7 * 1.0 + 3 * 2.0) / 1e6:.9f}"
        with c.responses.stream(model="auto", input="streamed") as s:
            assert s.get_final_response().output_text == "native streamed"
        # The native pool down: the fallback pool gets the request translated to chat.
        http_post(nurl + "/_control", orjson.dumps({"fail": 503}))
        raw = c.responses.with_raw_response.create(model="auto", input="fall back")
        assert raw.headers["x-switchyard-pool"] == "chatonly" and raw.parse().output_text.endswith("fall back")
        # That answer was stored here; the native pool, back, gets the chain as its whole input.
        http_post(nurl + "/_control", orjson.dumps({"fail": 0}))
        c.responses.create(model="auto", input="and then?", previous_response_id=raw.parse().id)
        got = httpx.get(nurl + "/_state", timeout=5).json()["last_body"]
        assert "previous_response_id" not in got
        assert got["input"][0] == {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                                  "text": "fall back"}]}
        assert got["input"][1]["role"] == "assistant" and got["input"][-1] == {"role": "user", "content": "and then?"}
    finally:
        gw.stop()
        native.stop()
        chat.stop()


def test_route_explains_any_of_the_three_apis(fresh):
    c = client(fresh)
    first = c.responses.create(model="auto", input="one")

    def route(body: dict, query: str = "") -> dict:
        status, raw = http_post(fresh.url + "/v1/route" + query, orjson.dumps(body))
        assert status == 200, raw
        return orjson.loads(raw)

    r = route({"input": "a hard problem", "previous_response_id": first.id})
    assert r["api"] == "responses" and r["rule"] == "keyword" and r["session_id"] == first.id
    assert r["features"]["turns"] == 2  # the chain's first turn and this one
    m = route({"max_tokens": 10, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]})
    assert m["api"] == "messages" and m["pool"] == "small"
    assert route({"messages": [{"role": "user", "content": "hi"}]})["api"] == "chat"
    assert route({"prompt": "hi"})["api"] == "completions"
    assert route({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}, "?api=messages")["api"] == "messages"
    status, raw = http_post(fresh.url + "/v1/route?api=soap", b'{"input": "x"}')
    assert status == 400 and orjson.loads(raw)["error"]["param"] == "api"


def test_count_tokens_by_the_pools_tokenizer_else_an_estimate(fresh):
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "one two three four"}]})
    r = httpx.post(fresh.url + "/v1/messages/count_tokens?beta=true", content=body, timeout=10,
                   headers={"anthropic-version": "2023-06-01", "content-type": "application/json"})
    assert r.status_code == 200 and r.json() == {"input_tokens": 4}
    assert r.headers["x-switchyard-token-count"] == "tokenizer of pool small (text)"  # it takes no messages
    for name in ("s0", "s1"):
        fresh.control(name, tokenize=False)
    try:
        r = httpx.post(fresh.url + "/v1/messages/count_tokens", content=body, timeout=10)
    finally:
        for name in ("s0", "s1"):
            fresh.control(name, tokenize=True)
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    assert r.headers["x-switchyard-token-count"].startswith("estimate")
    r = httpx.post(fresh.url + "/v1/messages/count_tokens", content=b'{"model": "auto"}', timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "error"  # Anthropic's shape


def test_an_upstream_dying_mid_stream_ends_with_error_and_response_failed(tmp_path):
    up, uurl = start_upstream(tmp_path, "dies")
    pol = tmp_path / "d.yaml"
    pol.write_text(f"version: 1\nname: d\npools:\n  p:\n    model: m\n    health: {{interval: 0}}\n"
                   f"    replicas: [{{url: '{uurl}/v1'}}]\nroutes: [{{name: default, pool: p}}]\n")
    gw, url = start_gateway(tmp_path, [pol])
    try:
        http_post(uurl + "/_control", orjson.dumps({"die_midstream": True, "chunk_delay_ms": 50}))
        with httpx.stream("POST", url + "/v1/responses", json={"model": "auto", "input": "hi", "stream": True},
                          timeout=30) as r:
            data = b"".join(r.iter_bytes())
        events = [orjson.loads(b.split(b"\ndata: ", 1)[1]) for b in data.split(b"\n\n") if b.strip()]
        types = [e["type"] for e in events]
        assert types[0] == "response.created" and "response.output_text.delta" in types
        assert types[-2:] == ["error", "response.failed"], types
        assert "failed mid-stream" in events[-1]["response"]["error"]["message"]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
    finally:
        gw.stop()
        up.stop()


def test_agents_sdk_streamed_and_its_tool_call(fresh):
    """The Agents SDK's default model (OpenAIResponsesModel) parses our answers and our event stream."""
    import asyncio

    from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    ran = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=fresh.url + "/v1", api_key="x", max_retries=0),
                              use_for_tracing=False)

    async def run() -> tuple[str, str]:  # one event loop: the SDK's client keeps its connections on it
        result = Runner.run_streamed(Agent(name="plain", instructions="Be brief.", model="auto"), "hi")
        kinds = [e.type async for e in result.stream_events()]
        assert "raw_response_event" in kinds
        for name in ("s0", "s1"):
            fresh.control(name, tool_call={"name": "get_weather", "arguments": {"city": "Oslo"}})
        agent = Agent(name="tools", model="auto", tools=[get_weather], tool_use_behavior="stop_on_first_tool")
        out = await Runner.run(agent, "weather in Oslo?")
        return str(result.final_output), str(out.final_output)

    streamed, tool = asyncio.run(run())
    assert streamed == "tok0 tok1 tok2 tok3 tok4 "
    assert ran == ["Oslo"] and tool == "sunny in Oslo"
