"""Pass-through against the real llama-server (issue 27 item 4): a pool that lists `responses` and
`messages` in its `api` gets those requests untranslated at llama-server's own /v1/responses and
/v1/messages, through the official openai and anthropic SDKs; a pool over the same server without
them gets the same requests translated to chat. Skips, saying why, without `make llama-cpp`."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from procs import Proc, free_port, start_gateway

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from engine_support import smollm2_path  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.engine]

POLICY = """
version: 1
name: cpp
pools:
  native:
    model: smollm2
    api: [chat, responses, messages]
    health: {{interval: 0}}
    replicas: [{{url: "{cpp}/v1", name: cpp-native}}]
  translated:
    model: smollm2
    health: {{interval: 0}}
    replicas: [{{url: "{cpp}/v1", name: cpp-chat}}]
routes:
  - name: chat-only
    when: {{header.x-backend: chat}}
    pool: translated
  - name: default
    pool: native
"""
ASK = "What is the capital of France?"


@dataclass
class Stack:
    gw_url: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    llamacpp = pytest.importorskip("switchyard.llamacpp", reason="switchyard.llamacpp (make llama-cpp) not here")
    reason = llamacpp.missing_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("cpp-pt")
    port = free_port()
    cpp_url = f"http://127.0.0.1:{port}"
    cpp = Proc([str(llamacpp.locate().server), "--model", str(smollm2_path()), "--host", "127.0.0.1", "--port",
                str(port), "--ctx-size", "2048", "--parallel", "1", "--jinja"],
               cpp_url + "/health", tmp / "llama-server.log", timeout=120, ready=lambda s: s == 200)
    (tmp / "cpp.yaml").write_text(POLICY.format(cpp=cpp_url))
    try:
        gw, url = start_gateway(tmp, [tmp / "cpp.yaml"])
    except Exception:
        cpp.stop()
        raise
    yield Stack(url)
    gw.stop()
    cpp.stop()


def test_responses_pass_through_and_translated(stack: Stack) -> None:
    c = openai.OpenAI(base_url=stack.gw_url + "/v1", api_key="x", max_retries=0, timeout=120)
    for backend, pool in (("native", "native"), ("chat", "translated")):
        raw = c.responses.with_raw_response.create(model="auto", input=ASK, max_output_tokens=8, temperature=0,
                                                   extra_headers={"x-backend": backend})
        r = raw.parse()
        assert raw.headers["x-switchyard-pool"] == pool
        assert r.object == "response" and r.output_text
    events = list(c.responses.create(model="auto", input=ASK, max_output_tokens=8, temperature=0, stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")


def test_messages_pass_through_and_translated(stack: Stack) -> None:
    c = anthropic.Anthropic(base_url=stack.gw_url, api_key="x", max_retries=0, timeout=120)
    for backend, pool in (("native", "native"), ("chat", "translated")):
        raw = c.messages.with_raw_response.create(model="auto", max_tokens=8, messages=[{"role": "user", "content": ASK}],
                                                  extra_headers={"x-backend": backend}, extra_body={"temperature": 0})
        m = raw.parse()
        assert raw.headers["x-switchyard-pool"] == pool
        assert m.type == "message" and m.content and m.content[0].type == "text"
    with c.messages.stream(model="auto", max_tokens=8, messages=[{"role": "user", "content": ASK}]) as s:
        assert s.get_final_message().content


def test_native_errors_come_back_as_the_server_sent_them(stack: Stack) -> None:
    r = httpx.post(stack.gw_url + "/v1/messages", json={"model": "auto", "messages": []}, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error"  # the gateway's own check, Anthropic's shape
