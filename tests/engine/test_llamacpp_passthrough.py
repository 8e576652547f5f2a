"""Pass-through to a real server that speaks the agent APIs itself (issue 27, item 4): llama.cpp's
llama-server serves /v1/responses and /v1/messages, so a pool that says `api: [chat, responses,
messages]` gets those bodies untranslated, while routing, keys, rate limits, usage and context
windows still apply. A second pool on the same server without `api` gets the same requests
translated to Chat Completions: the two answers differ in what only llama-server writes (its
Anthropic ids are `chatcmpl-...`, its Response objects have no `background` field, its Responses
events no `sequence_number`), which is how each test knows what answered.

On the binary `make llama-cpp` builds; the module skips, saying how to get it, without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from procs import ROOT, Proc, free_port, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.engine]

ADMIN_KEY = "test-admin-key-passthrough"
TEMPLATE = Path(__file__).parent / "data" / "chatml-tools.jinja"  # ChatML with tools (SmolLM2's own has none)
CTX, SLOTS = 4096, 2  # llama-server's --ctx-size and --parallel: each slot (each request) gets 2048
QUESTION = "What is the capital of France?"

POLICY = """
version: 1
name: cpp
pools:
  native:
    model: smollm2-cpp
    api: [chat, responses, messages]
    health: {{interval: 0.5s, timeout: 2s}}
    replicas: [{{url: "{cpp}/v1", name: cpp-0}}]
  translated:
    model: smollm2-cpp
    health: {{interval: 0.5s, timeout: 2s}}
    replicas: [{{url: "{cpp}/v1", name: cpp-0}}]
routes:
  - name: translate
    when: {{header.x-translate: "yes"}}
    pool: translated
  - name: default
    pool: native
"""


@dataclass
class Stack:
    cpp_url: str
    gw_url: str
    key: str  # may use both pools, no limit
    one_rpm: str  # one request a minute
    translated_only: str  # may reach the translated pool only

    def openai(self, key: str | None = None):
        from openai import OpenAI

        return OpenAI(base_url=self.gw_url + "/v1", api_key=key or self.key, timeout=120, max_retries=0)

    def anthropic(self, key: str | None = None):
        from anthropic import Anthropic

        return Anthropic(base_url=self.gw_url, api_key=key or self.key, timeout=120, max_retries=0)

    def metric(self, name: str, **labels: str) -> float:
        req = urllib.request.Request(self.gw_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            lines = r.read().decode().splitlines()
        want = [f'{k}="{v}"' for k, v in labels.items()]
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines
                   if ln.startswith(name + "{") and all(w in ln for w in want))

    def cpp_prompt_tokens(self) -> float:
        """Prompt tokens llama-server has processed (its own /metrics): what reached it."""
        with urllib.request.urlopen(self.cpp_url + "/metrics", timeout=5) as r:
            for ln in r.read().decode().splitlines():
                if ln.startswith("llamacpp:prompt_tokens_total"):
                    return float(ln.rsplit(" ", 1)[1])
        raise AssertionError("llama-server's /metrics has no llamacpp:prompt_tokens_total")


def _llama_server() -> Path:
    llamacpp = pytest.importorskip("switchyard.llamacpp", reason="switchyard.llamacpp (make llama-cpp) not here")
    reason = llamacpp.missing_reason()
    if reason:
        pytest.skip(reason)
    return llamacpp.locate().server


def _key(keys: Path, name: str, *extra: str) -> str:
    done = subprocess.run([sys.executable, "-m", "switchyard.cli", "keys", "create", "--name", name, "--keys-file",
                           str(keys), *extra], capture_output=True, text=True, cwd=ROOT, check=True)
    return done.stdout.split()[0]


@pytest.fixture(scope="module")
def stack(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = _llama_server()
    tmp = tmp_path_factory.mktemp("passthrough")
    port = free_port()
    cpp_url = f"http://127.0.0.1:{port}"
    argv = [str(binary), "-m", str(gguf_path), "--alias", "smollm2-cpp", "--host", "127.0.0.1", "--port", str(port),
            "--ctx-size", str(CTX), "--parallel", str(SLOTS), "--jinja", "--chat-template-file", str(TEMPLATE),
            "--metrics", "--threads", "1"]
    cpp = Proc(argv, cpp_url + "/health", tmp / "llama-server.log", timeout=120, ready=lambda s: s == 200)
    policy = tmp / "cpp.yaml"
    policy.write_text(POLICY.format(cpp=cpp_url))
    keys = tmp / "keys.json"
    made = (_key(keys, "agent"), _key(keys, "slow", "--rpm", "1"), _key(keys, "narrow", "--pools", "translated"))
    try:
        gw, gw_url = start_gateway(tmp, [policy], "--auth", "--keys-file", str(keys),
                                   env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY})
    except Exception:
        cpp.stop()
        raise
    try:
        deadline = time.monotonic() + 10
        while '"max_model_len"' not in _health(gw_url):  # the gateway reads llama-server's window
            assert time.monotonic() < deadline, _health(gw_url)
            time.sleep(0.1)
        yield Stack(cpp_url, gw_url, *made)
    finally:
        gw.stop()
        cpp.stop()


def _health(url: str) -> str:
    """The gateway's /health in full (with --auth, the details are the admin's)."""
    req = urllib.request.Request(url + "/health", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.read().decode()


def test_the_window_is_one_slot_of_llama_server(stack: Stack) -> None:
    health = json.loads(_health(stack.gw_url))
    replica = health["policies"]["cpp"]["pools"]["native"]["replicas"][0]
    assert replica["max_model_len"] == {"smollm2-cpp": CTX // SLOTS}


def test_responses_go_to_llama_server_untranslated(stack: Stack) -> None:
    client = stack.openai()
    raw = client.responses.with_raw_response.create(model="auto", input=QUESTION, max_output_tokens=20,
                                                    temperature=0)
    assert raw.headers["x-switchyard-pool"] == "native" and raw.headers["x-switchyard-replica"] == "cpp-0"
    body = raw.http_response.json()
    assert body["object"] == "response" and body["status"] == "completed"
    assert "background" not in body and "incomplete_details" not in body  # llama-server's own Response
    text = raw.parse().output_text
    assert text.strip(), body
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] > 0
    # The same request through the pool without `api`: the gateway's translation of a chat answer.
    raw = client.responses.with_raw_response.create(model="auto", input=QUESTION, max_output_tokens=20,
                                                    temperature=0, extra_headers={"x-translate": "yes"})
    assert raw.headers["x-switchyard-pool"] == "translated"
    body = raw.http_response.json()
    assert body["background"] is False and body["object"] == "response"
    assert raw.parse().output_text.strip()


def test_responses_stream_untranslated(stack: Stack) -> None:
    events = list(stack.openai().responses.create(model="native", input=QUESTION, max_output_tokens=20,
                                                  temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas.strip() and deltas == events[-1].response.output_text
    assert all(getattr(e, "sequence_number", None) is None for e in events)  # llama-server numbers none


def test_messages_go_to_llama_server_untranslated(stack: Stack) -> None:
    client = stack.anthropic()
    before = stack.metric("switchyard_tokens_total", pool="native", kind="completion")
    raw = client.messages.with_raw_response.create(
        model="auto", max_tokens=32000, system="Answer in one sentence.",  # Claude Code's 32000: lowered to fit
        messages=[{"role": "user", "content": QUESTION}])
    assert raw.headers["x-switchyard-pool"] == "native"
    msg = raw.parse()
    assert msg.id.startswith("chatcmpl-"), msg.id  # llama-server's id: the gateway would have made msg_...
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "text"
    assert msg.content[0].text.strip() and msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.usage.output_tokens > 0
    # Usage from llama-server's own Anthropic answer is counted as any other
    deadline = time.monotonic() + 5
    while stack.metric("switchyard_tokens_total", pool="native", kind="completion") - before < msg.usage.output_tokens:
        assert time.monotonic() < deadline, "the pass-through answer's tokens were not counted"
        time.sleep(0.05)
    translated = client.messages.create(model="translated", max_tokens=20,
                                        messages=[{"role": "user", "content": QUESTION}])
    assert translated.id.startswith("msg_") and translated.content[0].text.strip()


def test_messages_stream_untranslated(stack: Stack) -> None:
    with stack.anthropic().messages.stream(model="native", max_tokens=30,
                                           messages=[{"role": "user", "content": QUESTION}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.strip() and final.content[0].text == text
    assert final.id.startswith("chatcmpl-") and final.usage.output_tokens > 0


def test_keys_limits_and_windows_still_apply(stack: Stack) -> None:
    import anthropic

    # A key that may not reach the pass-through pool: Anthropic's 403, nothing sent.
    with pytest.raises(anthropic.PermissionDeniedError):
        stack.anthropic(stack.translated_only).messages.create(
            model="native", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    # One request a minute: the second is Anthropic's 429 with retry-after.
    slow = stack.anthropic(stack.one_rpm)
    slow.messages.create(model="native", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.RateLimitError) as e:
        slow.messages.create(model="native", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert e.value.response.headers.get("retry-after")
    # A prompt past the slot's window: the gateway's own "prompt is too long", llama-server never sees it.
    seen = stack.cpp_prompt_tokens()
    t0 = time.perf_counter()
    with pytest.raises(anthropic.BadRequestError) as e:
        stack.anthropic().messages.create(model="native", max_tokens=100,
                                          messages=[{"role": "user", "content": "word " * 4000}])
    assert time.perf_counter() - t0 < 1.0
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert e.value.body["error"]["message"].startswith("prompt is too long: "), e.value.body
    assert stack.cpp_prompt_tokens() == seen
