"""The Responses API end to end through real parts: the openai SDK and the OpenAI Agents SDK (its
default OpenAIResponsesModel) against two gateways sharing one Redis, in front of our engine
serving SmolLM2 (the session's shared int4 server, tests/conftest.py; greedy, a few tokens),
translated to chat and back."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from procs import Proc, start_gateway

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "state"))
from statekit import RedisServer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.engine]

POLICY = """
version: 1
name: agents
pools:
  small:
    model: smollm2-135m
    health: {{interval: 0}}
    replicas: [{{url: '{url}/v1', name: e0}}]
session: {{pin: pool}}
routes: [{{name: default, pool: small}}]
"""
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"]}}
GREEDY = {"temperature": 0, "max_output_tokens": 8}


@dataclass
class Two:
    a: openai.OpenAI
    b: openai.OpenAI
    a_url: str
    procs: list[Proc]


@pytest.fixture(scope="module")
def gws(smollm2_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Two]:
    tmp = tmp_path_factory.mktemp("resp-gw")
    redis = RedisServer(tmp)
    (tmp / "agents.yaml").write_text(POLICY.format(url=smollm2_server.url))
    procs: list[Proc] = []
    try:
        urls = []
        for name in ("gw-a", "gw-b"):
            p, url = start_gateway(tmp, [tmp / "agents.yaml"], "--redis", redis.url, name=name)
            procs.append(p)
            urls.append(url)
        a, b = (openai.OpenAI(base_url=u + "/v1", api_key="unused", max_retries=0, timeout=120) for u in urls)
        yield Two(a, b, urls[0], procs)
    finally:
        for p in procs:
            p.stop()
        redis.stop()


def test_plain_and_streamed_give_the_same_greedy_answer(gws):
    plain = gws.a.responses.create(model="auto", instructions="Answer briefly.", input="What is the capital of France?",
                                   **GREEDY)
    assert plain.status in ("completed", "incomplete") and plain.output_text
    assert plain.usage.input_tokens > 10 and 0 < plain.usage.output_tokens <= 8
    # The SDK's stream helper takes only response.completed as the end (8 tokens may cut the answer:
    # response.incomplete), so the raw event stream is read and its last event holds the response.
    events = list(gws.a.responses.create(model="auto", instructions="Answer briefly.",
                                         input="What is the capital of France?", stream=True, **GREEDY))
    final = events[-1].response
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text
    assert final.output_text == plain.output_text
    # The prompt's start is in the engine's prefix cache now.
    again = gws.a.responses.create(model="auto", instructions="Answer briefly.", input="What is the capital of France?",
                                   **GREEDY)
    assert again.usage.input_tokens_details.cached_tokens > 0


def test_max_output_tokens_makes_it_incomplete(gws):
    r = gws.a.responses.create(model="auto", input="Count from one to twenty in words.", temperature=0,
                               max_output_tokens=2)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 2


def test_forced_call_then_its_output_through_the_other_gateway(gws):
    """A forced function call on gateway A; its function_call_output, chained by
    previous_response_id, answered through gateway B (the chain is in the shared Redis)."""
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        r = gws.a.responses.create(model="auto", input="What is the weather in Paris?", tools=[WEATHER],
                                   tool_choice=choice, temperature=0, max_output_tokens=32)
        call = next(o for o in r.output if o.type == "function_call")
        assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    answer = gws.b.responses.create(
        model="auto", previous_response_id=r.id, tools=[WEATHER], **GREEDY,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C and sunny"}])
    assert answer.previous_response_id == r.id
    assert any(o.type == "message" for o in answer.output) or any(o.type == "function_call" for o in answer.output)
    # Stored through B, retrieved and deleted through A.
    assert gws.a.responses.retrieve(answer.id).output == answer.output
    gws.a.responses.delete(answer.id)
    with pytest.raises(openai.NotFoundError):
        gws.b.responses.retrieve(answer.id)


def test_agents_sdk_runs_a_tool_loop(gws):
    """The Agents SDK with its default model class (OpenAIResponsesModel): the first turn must
    call the tool (tool_choice required), the tool runs, and the model answers from its output."""
    from agents import (
        Agent,
        ModelSettings,
        Runner,
        function_tool,
        set_default_openai_client,
        set_tracing_disabled,
    )

    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"It is 18C and sunny in {city}."

    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=gws.a_url + "/v1", api_key="unused", max_retries=0),
                              use_for_tracing=False)
    agent = Agent(name="weather", instructions="Use the tool, then answer in a few words.", tools=[get_weather],
                  model="auto", tool_use_behavior="run_llm_again",
                  model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64))

    async def run() -> str:
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        return str(result.final_output)

    try:
        out = asyncio.run(run())
    except Exception as e:  # MaxTurnsExceeded: the model kept calling the tool; the loop itself ran
        if type(e).__name__ != "MaxTurnsExceeded":
            raise
        out = ""
    assert calls, "the tool never ran"
    assert len(calls) >= 1 and (out or len(calls) > 1)


def test_count_tokens_by_the_engines_own_tokenizer(gws):
    """/v1/messages/count_tokens asks the routed pool's engine (POST /tokenize with the messages:
    the chat template's tokens counted too)."""
    import httpx

    body = {"model": "auto", "system": "Be brief.", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    r = httpx.post(gws.a_url + "/v1/messages/count_tokens", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-switchyard-token-count"] == "tokenizer of pool small (chat template)"
    assert 10 < r.json()["input_tokens"] < 60
