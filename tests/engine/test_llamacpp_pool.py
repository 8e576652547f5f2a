"""Proof with a real third-party server (issue 19): llama.cpp's `llama-server`, serving the same
SmolLM2 GGUF as our engine, as a pool beside it behind the gateway, through the official OpenAI
SDK: chat, streaming, tools, errors, routing between the two pools, and health ejection (with
fallback to our engine) when llama-server is killed.

llama-server runs the exact command `switchyard plan` emits for a `runtime: llama.cpp` pool
(switchyard/cluster/launch.py), on the binary `make llama-cpp` builds; where that build is
missing the module skips and says how to get it.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from engine_support import EngineServer
from procs import Proc, free_port, start_gateway

from switchyard.cluster.launch import Site, node_launch
from switchyard.cluster.local import plan_local
from switchyard.policy.loader import parse_policy

ADMIN_KEY = "test-admin-key-llamacpp"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
FRANCE = [{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "What is the capital of France?"}]
# SmolLM2's own template has no tools; this one (ChatML, tools in the system turn) lets llama.cpp
# render them and build its tool-call grammar.
TEMPLATE = Path(__file__).parent / "data" / "chatml-tools.jinja"
# An agent's loop: an earlier call and its result, then a new question, which a 135M model
# answers with a call when it has seen one.
AGENT_TURNS = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"},
    {"role": "assistant", "content": "It is sunny in Rome, 24 C."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


@dataclass
class Stack:
    cpp: Proc
    cpp_url: str
    gw: Proc
    gw_url: str
    argv: list[str]
    gguf: Path

    def client(self):
        from openai import OpenAI

        return OpenAI(base_url=self.gw_url + "/v1", api_key="unused", timeout=120, max_retries=0)

    def replicas(self) -> dict[str, dict]:
        req = urllib.request.Request(self.gw_url + "/admin/replicas",
                                     headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return {x["name"]: x for x in json.loads(r.read())["replicas"]}


def _llama_server() -> Path:
    llamacpp = pytest.importorskip("switchyard.llamacpp", reason="switchyard.llamacpp (make llama-cpp) not here")
    reason = llamacpp.missing_reason()
    if reason:
        pytest.skip(reason)
    return llamacpp.locate().server


def _planned_command(gguf: Path, port: int, binary: Path) -> list[str]:
    """What `switchyard plan` launches for this pool, with the binary built here."""
    planning = parse_policy(yaml.safe_dump({
        "pools": {"cpp": {"model": "smollm2-cpp", "replicas": [{"url": f"http://127.0.0.1:{port}/v1"}],
                          "engine": {"runtime": "llama.cpp", "model": str(gguf),
                                     "args": ["--ctx-size", "2048", "--parallel", "2",
                                              "--chat-template-file", str(TEMPLATE)]}}},
        "routes": [{"name": "d", "pool": "cpp"}],
    }))
    rep = plan_local(planning).replicas[0]
    return list(node_launch(rep, Site(rep.leader), llama_server=str(binary)).main)


POLICY = """
version: 1
name: pair
pools:
  ours:
    model: smollm2-ours
    health: {{interval: 0.5s, timeout: 1s}}
    replicas: [{{url: "{ours}/v1", name: ours-0}}]
  cpp:
    model: smollm2-cpp
    health: {{interval: 0.5s, timeout: 1s}}
    circuit: {{failures: 1, cooldown: 60s}}
    replicas: [{{url: "{cpp}/v1", name: cpp-0}}]
routes:
  - name: to-cpp
    when: {{header.x-backend: cpp}}
    pool: cpp
  - name: tools
    when: {{tools: ">= 1"}}
    pool: cpp
  - name: default
    pool: ours
fallback:
  cpp: [ours]
"""


@pytest.fixture(scope="module")
def stack(server_tp1: EngineServer, gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = _llama_server()
    tmp = tmp_path_factory.mktemp("llamacpp")
    port = free_port()
    argv = _planned_command(gguf_path, port, binary)
    cpp_url = f"http://127.0.0.1:{port}"
    # /health answers 503 while the model loads, 200 once it serves.
    cpp = Proc(argv, cpp_url + "/health", tmp / "llama-server.log", timeout=120, ready=lambda s: s == 200)
    policy = tmp / "pair.yaml"
    policy.write_text(POLICY.format(ours=server_tp1.url, cpp=cpp_url))
    try:
        # The admin key from the environment, as the emitted deployments give it.
        gw, gw_url = start_gateway(tmp, [policy], env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY})
    except Exception:
        cpp.stop()
        raise
    yield Stack(cpp, cpp_url, gw, gw_url, argv, gguf_path)
    gw.stop()
    cpp.stop()


def test_llama_server_runs_the_planned_command(stack: Stack) -> None:
    assert stack.argv[1] == "-m" and stack.argv[2] == str(stack.gguf)
    assert stack.argv[3:5] == ["--alias", "smollm2-cpp"] and "--jinja" in stack.argv
    with urllib.request.urlopen(stack.cpp_url + "/v1/models", timeout=5) as r:
        assert "smollm2-cpp" in {m["id"] for m in json.loads(r.read())["data"]}


def test_chat_routes_between_the_two_pools_serving_the_same_model(stack: Stack) -> None:
    client = stack.client()
    seen = {}
    for backend in ("cpp", None):
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=FRANCE, temperature=0, max_tokens=30,
            extra_headers={"x-backend": backend} if backend else None)
        reply = raw.parse()
        seen[raw.headers["x-switchyard-pool"]] = (raw.headers["x-switchyard-rule"], raw.headers["x-switchyard-replica"])
        assert "Paris" in reply.choices[0].message.content, reply
        assert reply.usage.completion_tokens > 0 and reply.choices[0].finish_reason in ("stop", "length")
    assert seen == {"cpp": ("to-cpp", "cpp-0"), "ours": ("default", "ours-0")}
    # A pool's name as the model goes straight there.
    raw = client.chat.completions.with_raw_response.create(model="cpp", messages=FRANCE, max_tokens=8)
    assert raw.headers["x-switchyard-pool"] == "cpp" and raw.parse().choices[0].message.content


def test_stream_from_llama_server_is_relayed_chunk_by_chunk(stack: Stack) -> None:
    stream = stack.client().chat.completions.create(
        model="cpp", messages=[{"role": "user", "content": "Count from one to five."}], stream=True,
        temperature=0, max_tokens=40, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3 and text.strip()
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_stream_without_usage_asked_is_counted_and_kept_from_the_client(stack: Stack) -> None:
    def tokens() -> float:
        req = urllib.request.Request(stack.gw_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            lines = r.read().decode().splitlines()
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines
                   if ln.startswith("switchyard_tokens_total{") and 'pool="cpp"' in ln and 'kind="completion"' in ln)

    before = tokens()
    chunks = list(stack.client().chat.completions.create(
        model="cpp", messages=[{"role": "user", "content": "Count from one to five."}], stream=True,
        temperature=0, max_tokens=20))
    # The gateway asked llama-server for usage; its usage chunk never reaches this client.
    assert chunks and all(c.usage is None for c in chunks) and all(c.choices for c in chunks)
    # Counted when the upstream's stream ends, which may be just after the client read [DONE].
    deadline = time.monotonic() + 5
    while tokens() - before <= 0:
        assert time.monotonic() < deadline, "the stream's tokens were never counted"
        time.sleep(0.05)


def test_tools_go_to_llama_server_and_come_back_as_tool_calls(stack: Stack) -> None:
    raw = stack.client().chat.completions.with_raw_response.create(
        model="auto", tools=TOOLS, tool_choice="required", temperature=0, max_tokens=60, messages=AGENT_TURNS)
    assert raw.headers["x-switchyard-pool"] == "cpp" and raw.headers["x-switchyard-rule"] == "tools"
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert "city" in json.loads(call.function.arguments), call.function.arguments


def test_errors_keep_openais_shape(stack: Stack) -> None:
    import openai

    client = stack.client()
    # llama-server's own refusal (a prompt past its context), relayed with its status and message.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="cpp", max_tokens=8,
                                       messages=[{"role": "user", "content": "word " * 3000}])
    assert e.value.status_code == 400 and "context" in str(e.value.message).lower()
    # The gateway's own: an unknown model, a malformed request.
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=FRANCE)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="cpp", messages="not a list")  # type: ignore[arg-type]


def test_killed_llama_server_is_ejected_and_its_pool_falls_back_to_our_engine(stack: Stack) -> None:
    assert stack.replicas()["cpp-0"]["healthy"] is True
    stack.cpp.kill()
    killed = time.monotonic()
    while stack.replicas()["cpp-0"]["healthy"]:
        # Health checks every 0.5 s with a 1 s timeout: ejected well within 5 s.
        assert time.monotonic() - killed < 5, stack.replicas()["cpp-0"]
        time.sleep(0.1)
    print(f"llama-server ejected {time.monotonic() - killed:.2f} s after SIGKILL")
    assert stack.replicas()["ours-0"]["healthy"] is True
    client = stack.client()
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=FRANCE, temperature=0, max_tokens=30, extra_headers={"x-backend": "cpp"})
    assert raw.headers["x-switchyard-pool"] == "ours" and "Paris" in raw.parse().choices[0].message.content
    chunks = list(client.chat.completions.create(model="auto", messages=FRANCE, stream=True, max_tokens=8,
                                                 extra_headers={"x-backend": "cpp"}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
