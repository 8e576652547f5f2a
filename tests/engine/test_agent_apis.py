"""What agent clients ask a replica besides completions: its context window in /v1/models,
token counts from /tokenize, and a --max-model-len that defaults to the model's own window."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from engine_support import EngineServer, get, post

from switchyard.engine.errors import ConfigError
from switchyard.engine.runner.options import (
    AUTO_GRAMMAR_THREADS,
    AVERAGE_SEQ_TOKENS,
    LANES_PER_THREAD,
    EngineOptions,
    auto_grammar_threads,
    auto_kv_blocks,
    resolved_len,
)

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


@pytest.mark.engine
@pytest.mark.slow
def test_models_reports_max_model_len(server_tp1: EngineServer) -> None:
    status, models = get(server_tp1.url + "/v1/models")
    assert status == 200 and models["data"][0]["max_model_len"] == 1024  # SERVER_ARGS' --max-model-len


@pytest.mark.engine
@pytest.mark.slow
def test_tokenize_content_and_chat_counts(server_tp1: EngineServer, gguf_path: Path) -> None:
    from switchyard.engine.chat.tokenizer import from_gguf
    from switchyard.engine.model.weights import GGUFSource

    tok = from_gguf(GGUFSource(gguf_path).reader)
    url = server_tp1.url + "/tokenize"
    status, r = post(url, {"content": "Hello, world"})
    assert status == 200 and r == {"tokens": tok.encode("Hello, world", add_special=False)} and r["tokens"]
    # The chat form counts the prompt the chat endpoint prefills: the same number as its usage.
    for tools in (None, TOOLS):
        status, counted = post(url, {"messages": CHAT, **({"tools": tools} if tools else {})})
        assert status == 200 and counted["count"] == len(counted["tokens"]) > 10, counted
        status, done = post(server_tp1.url + "/v1/chat/completions",
                            {"messages": CHAT, "max_tokens": 1, "temperature": 0, **({"tools": tools} if tools else {})})
        assert status == 200 and done["usage"]["prompt_tokens"] == counted["count"]
    with_tools = post(url, {"messages": CHAT, "tools": TOOLS})[1]["count"]
    assert with_tools > post(url, {"messages": CHAT})[1]["count"]  # the tool schema is in the prompt
    for bad, param in (({"content": 5}, "content"), ({}, "messages"), ({"content": "a", "messages": CHAT}, "content"),
                       ({"messages": []}, "messages"), ({"content": "a", "add_special": "yes"}, "add_special")):
        status, err = post(url, bad)
        assert status == 400 and err["error"]["param"] == param, (bad, err)


def test_max_model_len_defaults_to_the_models_window(gguf_path: Path) -> None:
    """SmolLM2's GGUF says 8192; 0 (the CLI's default) serves that, a smaller value caps it."""
    from switchyard.engine.model.weights import open_source

    window = open_source(gguf_path).config.max_position
    assert window == 8192
    opts = EngineOptions(model_path=gguf_path)
    assert opts.max_model_len == 0 and resolved_len(opts, window) == 8192
    assert resolved_len(opts.replace(max_model_len=1024), window) == 1024
    assert resolved_len(opts.replace(max_model_len=100_000), window) == 8192


def test_auto_kv_pool_holds_one_window_plus_average_sequences() -> None:
    # 16 sequences at SmolLM2's 8192 window: one whole window plus 15 of 2048 tokens, 2432
    # blocks (1.8 GB of float32 cache) instead of 16 windows' 8192 (6 GB).
    assert auto_kv_blocks(16, 8192, 16) == 512 + 15 * AVERAGE_SEQ_TOKENS // 16 == 2432
    assert auto_kv_blocks(16, 1024, 16) == 16 * 64  # windows up to 2048: every sequence whole, as before
    assert auto_kv_blocks(1, 8192, 16) == 512


def test_options_are_checked_once_from_flags_and_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--device must be one of cpu, cuda"):
        EngineOptions(model_path=tmp_path, device="tpu")
    with pytest.raises(ConfigError, match="at least 64 blocks of 16"):
        EngineOptions(model_path=tmp_path, max_model_len=1024, num_kv_blocks=10)
    opts = EngineOptions.from_mapping({"model_path": str(tmp_path), "max-num-seqs": 4, "prefix_caching": False})
    assert opts.max_num_seqs == 4 and not opts.prefix_caching and opts.model_path == tmp_path
    # The grammar masks' fill threads: auto is one on a CPU (its cores decode), up to 8 on a GPU's host.
    assert EngineOptions(model_path=tmp_path).fill_threads == 1
    assert EngineOptions(model_path=tmp_path, device="cuda").fill_threads == auto_grammar_threads("cuda")
    assert 1 <= auto_grammar_threads("cuda") <= min(AUTO_GRAMMAR_THREADS, max(1, (os.cpu_count() or 2) // 2))
    assert EngineOptions.from_mapping({"model_path": "x", "grammar-threads": 3}).fill_threads == 3
    # Each grammar's compilations: one for one thread (nothing shared), LANES_PER_THREAD a thread for a pool.
    assert EngineOptions(model_path=tmp_path).fill_lanes == 1
    assert EngineOptions(model_path=tmp_path, grammar_threads=3).fill_lanes == 3 * LANES_PER_THREAD
    # Where they fill: a process of their own on a GPU (chat/grammar_process), a thread on a CPU or when asked.
    assert EngineOptions(model_path=tmp_path, device="cuda").fill_process
    assert not EngineOptions(model_path=tmp_path).fill_process
    assert not EngineOptions(model_path=tmp_path, device="cuda", grammar_fill="thread").fill_process
    assert EngineOptions.from_mapping({"model_path": "x", "grammar-fill": "process"}).fill_process
    with pytest.raises(ConfigError, match="--grammar-fill must be one of auto, thread, process"):
        EngineOptions(model_path=tmp_path, grammar_fill="fork")
    with pytest.raises(ConfigError, match="--grammar-threads must be at least 0"):
        EngineOptions(model_path=tmp_path, grammar_threads=-1)
    for bad, why in (({"model_path": "x", "max_num_seqs": "4"}, "must be int"),
                     ({"model_path": "x", "max_num_seqs": True}, "must be int"),
                     ({"model_path": "x", "colective": "ring"}, "unknown engine option"),
                     ({"tp": 2}, "need model_path")):
        with pytest.raises(ConfigError, match=why):
            EngineOptions.from_mapping(bad)
