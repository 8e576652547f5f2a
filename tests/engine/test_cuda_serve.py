"""`engine serve --device cuda` end to end: constrained decoding and prefix caching on the GPU
path (Triton decode kernels in CUDA graphs, paged KV cache), through HTTP.

The model is random weights with SmolLM2's widths (4 layers) beside SmolLM2's real tokenizer
and chat template: text is gibberish, but a constrained reply must still parse and validate,
and greedy decoding must give the same tokens with and without a cached prefix. float32, so
that the cached prefill (attention over gathered blocks) and the fresh one (flash attention)
agree to rounding and greedy choices cannot flip. Runs where a GPU is (CI has none); a device
run carries the tokenizer as SWITCHYARD_TEST_TOKENIZER_DIR (the real GGUF is 98 MB).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import torch
from engine_support import EngineServer, get

from switchyard.engine.model.config import ModelConfig
from switchyard.engine.model.random_weights import SMOLLM2_135M, random_weights
from switchyard.engine.runner.options import auto_grammar_threads, grammar_lanes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")

CFG = dataclasses.replace(SMOLLM2_135M, num_layers=4)
SYSTEM = "You are a careful assistant. " * 40  # ~240 tokens: 15 full blocks to cache
# Bounded strings and arrays: a random model would otherwise write one string to its token budget.
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city", "unit", "days"]}
TRIP = {"type": "object", "properties": {
    "traveler": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                                  "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                 "required": ["name", "age"]},
    "destinations": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 2},
    "seat": {"type": "string", "enum": ["economy", "business"]}}, "required": ["traveler", "destinations", "seat"]}
SCHEMAS = {"get_weather": WEATHER, "book_trip": TRIP}
TOOLS = [{"type": "function", "function": {"name": n, "description": n.replace("_", " "), "parameters": p}}
         for n, p in SCHEMAS.items()]


def write_tokenizer(d: Path) -> None:
    """SmolLM2's tokenizer.json and chat template into d (from the carried copy, else the GGUF)."""
    src = os.environ.get("SWITCHYARD_TEST_TOKENIZER_DIR")
    if src:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (d / name).write_bytes((Path(src) / name).read_bytes())
        return
    from engine_support import smollm2_path

    from switchyard.engine.chat import tokenizer
    from switchyard.engine.model.gguf_file import GGUFFile

    t = tokenizer.from_gguf(GGUFFile(smollm2_path()))
    (d / "tokenizer.json").write_text(t.tok.to_str())
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": t.template_src, "bos_token": t.bos,
                                                         "eos_token": "<|im_end|>"}))


def write_random_model(d: Path, cfg: ModelConfig, seed: int, max_positions: int) -> None:
    """A Hugging Face model folder in d: `cfg`'s shapes with random weights (safetensors), its
    config.json, and SmolLM2's tokenizer."""
    from safetensors.torch import save_file

    save_file({f"model.{k}": v.contiguous() for k, v in random_weights(cfg, seed=seed).items()},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": max_positions, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}))
    write_tokenizer(d)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    d = tmp_path_factory.mktemp("random-smollm2")
    write_random_model(d, CFG, seed=11, max_positions=2048)
    s = EngineServer(d, d / "engine.log", standalone=True,
                     extra=["--device", "cuda", "--dtype", "float32", "--decode-kernels", "fused", "--max-model-len", "1024",
                            "--max-num-seqs", "8", "--pin-cpus", "on"])
    yield s
    s.close()


def chat(server: EngineServer, **body: object) -> dict:
    import httpx

    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "m", "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_health_says_gpu_fused_kernels_and_structured_output(server: EngineServer) -> None:
    status, h = get(server.url + "/health")
    assert status == 200
    dev = h["device"]
    assert dev["device"].startswith("cuda") and dev["decode_kernels"] == "fused" and dev["cuda_graphs"] is True
    assert dev["prefill_kernels"] == "fused"
    assert h["structured_output"]["supported"]
    assert h["structured_output"]["lanes"] == grammar_lanes(auto_grammar_threads("cuda"))  # the fill pool's, auto
    assert h["structured_output"]["fill"] == "process"  # a GPU replica's default: a process of their own
    if len(os.sched_getaffinity(0)) >= 3:  # --pin-cpus on: the loop on a core of its own, the fill on the others
        cpus = h["cpus"]
        assert cpus["grammar_fill"] and cpus["loop"] not in cpus["grammar_fill"]


def test_concurrent_constrained_replies_validate_through_the_fill_pool_on_the_gpu(server: EngineServer) -> None:
    """Eight constrained requests at once: their rows' masks filled by the fill process's pool of threads
    over the grammar's lanes (a GPU replica's default), each reply still its schema's."""
    from concurrent.futures import ThreadPoolExecutor

    schema = SCHEMAS["get_weather"]
    body = {"max_tokens": 200, "response_format": {"type": "json_schema",
                                                     "json_schema": {"name": "f", "schema": schema, "strict": True}}}
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda k: chat(server, messages=[{"role": "user", "content": f"Forecast {k}."}],
                                               temperature=0.8, seed=k, **body), range(8)))
    for r in replies:
        assert r["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)
    assert get(server.url + "/health")[1]["structured_output"]["fill"] == "process"  # made, not fallen back


def test_required_calls_and_json_schema_validate_on_the_gpu(server: EngineServer) -> None:
    for prompt in ("Weather in Oslo?", "Book a trip to Rome for Ann."):
        r = chat(server, messages=[{"role": "user", "content": prompt}], tools=TOOLS, tool_choice="required",
                 parallel_tool_calls=False, max_tokens=200)
        choice = r["choices"][0]
        calls = choice["message"]["tool_calls"]
        assert choice["finish_reason"] == "tool_calls" and calls
        for c in calls:
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    schema = SCHEMAS["get_weather"]
    r = chat(server, messages=[{"role": "user", "content": "A forecast as JSON."}], max_tokens=200,
             response_format={"type": "json_schema", "json_schema": {"name": "f", "schema": schema, "strict": True}})
    assert r["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)


def test_a_cached_prefix_gives_the_uncached_tokens_on_the_gpu(server: EngineServer) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "First question."}]
    first = chat(server, messages=messages, max_tokens=24, ignore_eos=True)
    again = chat(server, messages=messages, max_tokens=24, ignore_eos=True)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * 14
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    other = chat(server, messages=[messages[0], {"role": "user", "content": "Another one."}], max_tokens=8)
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * 14  # the shared system prompt
    kv = get(server.url + "/health")[1]["kv_cache"]
    assert kv["prefix_cache_hit_rate"] > 0


def test_a_streamed_call_adds_up_to_the_whole_reply_on_the_gpu(server: EngineServer) -> None:
    import httpx

    body = {"model": "m", "temperature": 0, "max_tokens": 200, "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "messages": [{"role": "user", "content": "Weather in Lima?"}]}
    whole = chat(server, **{k: v for k, v in body.items() if k not in ("model", "temperature")})
    call = whole["choices"][0]["message"]["tool_calls"][0]["function"]
    pieces, name = [], None
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for d in json.loads(line[6:])["choices"][0]["delta"].get("tool_calls") or []:
                name = d.get("function", {}).get("name") or name
                pieces.append(d.get("function", {}).get("arguments") or "")
    assert name == "get_weather" and len([p for p in pieces if p]) >= 3
    assert "".join(pieces) == call["arguments"]
    jsonschema.validate(json.loads(call["arguments"]), SCHEMAS["get_weather"])
