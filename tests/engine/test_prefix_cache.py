"""Paged KV cache with automatic prefix caching, through real engine processes on SmolLM2:
a cached prefix gives the uncached greedy output (float32 and int4), concurrent requests share
a prefix's blocks, eviction and preemption under a small block pool, cached_tokens in every
response shape, /health and /metrics."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from engine_support import ONE_THREAD, SERVER_ARGS, EngineServer, get, post, stream

# A system prompt long enough to span many blocks (~330 tokens), as an agent's tool docs do.
SYSTEM = ("You are a careful assistant for a warehouse. Tools: " + " ".join(
    f"Tool {i} moves crate {i} from shelf {i % 7} to dock {i % 3} and logs the move with a timestamp."
    for i in range(16)))
QUESTIONS = ["Which dock does crate 5 go to?", "Name the shelf of crate 9.", "What does tool 2 log?",
             "How many docks are there?", "Summarize tool 11 in five words.", "Which crate does tool 14 move?"]


def _chat(question: str, system: str = SYSTEM, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "temperature": 0, "max_tokens": 24, **kw}


def _ask(url: str, body: dict[str, Any]) -> tuple[str, int, int]:
    """(text, prompt tokens, cached tokens) of a non-streamed chat completion."""
    status, r = post(url + "/v1/chat/completions", body)
    assert status == 200, r
    u = r["usage"]
    return r["choices"][0]["message"]["content"], u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]



def _health_once(url: str, settled: Callable[[dict[str, Any]], bool], seconds: float = 10.0) -> dict[str, Any]:
    """/health once its kv_cache block is `settled`, or after `seconds`: the last request's blocks
    are freed on the scheduler's next step, which may come a moment after its answer went out
    (CI runs read 3 of 32 blocks free once, and 34% of the cache in use once)."""
    deadline = time.monotonic() + seconds
    while True:
        status, health = get(url + "/health")
        assert status == 200, health
        if settled(health["kv_cache"]) or time.monotonic() > deadline:
            return health
        time.sleep(0.05)

def _metric(url: str, name: str) -> float:
    status, text = get(url + "/metrics")
    assert status == 200
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


@pytest.fixture(scope="module")
def uncached(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    """The float32 reference: the shared test server's settings without prefix caching."""
    s = EngineServer(gguf_path, tmp_path_factory.mktemp("nocache") / "engine.log",
                     extra=[*SERVER_ARGS, "--no-prefix-caching"])
    yield s
    s.close()


@pytest.fixture(scope="module")
def small_pool(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    """The shipped defaults (int4 weights, float16 cache where the native kernels run) on a pool
    of 32 blocks of 16: 512 positions, one sequence of the maximum length, for 4 sequences."""
    s = EngineServer(gguf_path, tmp_path_factory.mktemp("small") / "engine.log",
                     extra=["--max-model-len", "512", "--max-num-seqs", "4", "--num-kv-blocks", "32",
                            "--collective", "ring", *ONE_THREAD])
    yield s
    s.close()


def test_cached_prefix_gives_the_uncached_greedy_output_float32(server_tp1: EngineServer,
                                                                uncached: EngineServer) -> None:
    """An agent's turns: turn 2 repeats turn 1's prompt and adds to it; with turn 1's blocks
    cached it prefills only the rest, and answers as the server without a cache does
    (logprobs too, to float32 rounding)."""
    system = SYSTEM + " Session 1."  # a prefix no other test sends
    turn1 = _chat(QUESTIONS[0], system)
    text1, n1, cached1 = _ask(server_tp1.url, turn1)
    assert cached1 == 0
    turn2 = {**turn1, "messages": [*turn1["messages"], {"role": "assistant", "content": text1},
                                   {"role": "user", "content": QUESTIONS[1]}], "logprobs": True, "top_logprobs": 3}
    status, warm = post(server_tp1.url + "/v1/chat/completions", turn2)
    status_ref, cold = post(uncached.url + "/v1/chat/completions", turn2)
    assert status == status_ref == 200, (warm, cold)
    cached2 = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert n1 - 16 <= cached2 < warm["usage"]["prompt_tokens"] and cached2 % 16 == 0, (n1, cached2)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    for a, b in zip(warm["choices"][0]["logprobs"]["content"], cold["choices"][0]["logprobs"]["content"], strict=True):
        assert a["token"] == b["token"] and abs(a["logprob"] - b["logprob"]) < 1e-4, (a, b)
    # The very same prompt again: everything but its last partial block (and last token) cached.
    _, n, cached = _ask(server_tp1.url, turn1)
    assert cached == (n1 - 1) // 16 * 16 and n == n1


def test_concurrent_requests_share_a_cached_prefix(server_tp1: EngineServer, uncached: EngineServer) -> None:
    """One request warms a system prompt; four concurrent ones with different questions then
    hold its blocks together, each answering as the uncached server does."""
    system = SYSTEM + " Session 2."
    _ask(server_tp1.url, _chat("Hello.", system, max_tokens=1))
    questions = QUESTIONS[:4]
    with ThreadPoolExecutor(4) as pool:
        warm = list(pool.map(lambda q: _ask(server_tp1.url, _chat(q, system, max_tokens=12)), questions))
        cold = list(pool.map(lambda q: _ask(uncached.url, _chat(q, system, max_tokens=12)), questions))
    shared = min(c for _, _, c in warm)
    assert shared >= 320, warm  # the system prompt's full blocks (~330 tokens of it)
    for q, (text, _, _), (ref, _, c) in zip(questions, warm, cold, strict=True):
        assert text == ref, q
        assert c == 0


def test_cached_tokens_in_every_response_shape(server_tp1: EngineServer) -> None:
    system = SYSTEM + " Session 3."
    _ask(server_tp1.url, _chat("Hi.", system))
    chunks = stream(server_tp1.url + "/v1/chat/completions",
                    _chat("Hi there.", system, stream_options={"include_usage": True}))
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 320 and chunks[-1]["choices"] == []
    prompt = system + " Question: which dock?"
    status, r = post(server_tp1.url + "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert status == 200 and r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no chat template: new
    status, r = post(server_tp1.url + "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == (r["usage"]["prompt_tokens"] - 1) // 16 * 16
    chunks = stream(server_tp1.url + "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                                         "stream_options": {"include_usage": True}})
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    status, health = get(server_tp1.url + "/health")
    kv = health["kv_cache"]
    assert kv["prefix_caching"] is True and kv["block_size"] == 16 and kv["blocks"] == 8 * 1024 // 16
    assert 0 < kv["prefix_cache_hit_rate"] < 1 and kv["free_blocks"] <= kv["blocks"]
    hits, queries = (_metric(server_tp1.url, f"vllm:prefix_cache_{k}_total") for k in ("hits", "queries"))
    assert 0 < hits < queries and queries >= kv["prefix_cache_queries"]
    assert 0.0 <= _metric(server_tp1.url, "vllm:kv_cache_usage_perc") <= 1.0


def test_eviction_keeps_answers_right_int4(small_pool: EngineServer) -> None:
    """int4 on a 32-block pool: turn 2 with turn 1's blocks cached, then other prompts evict
    them, then turn 2 again from scratch (nothing cached): the same tokens both times."""
    url = small_pool.url
    turn1 = _chat(QUESTIONS[2])
    text1, n1, _ = _ask(url, turn1)
    turn2 = {**turn1, "messages": [*turn1["messages"], {"role": "assistant", "content": text1},
                                   {"role": "user", "content": QUESTIONS[3]}]}
    warm, _, cached = _ask(url, turn2)
    assert cached >= n1 - 16
    for i in range(3):  # 3 x ~20 blocks through a 32-block pool: the least recently freed go
        _ask(url, _chat("Tell me about crates.", f"Unrelated system prompt {i}. " + SYSTEM[:1200], max_tokens=1))
    cold, _, cached = _ask(url, turn2)
    assert cached == 0, "turn 2's blocks should have been evicted"
    assert cold == warm
    # Every block comes back (no leak).
    health = _health_once(url, lambda kv: kv["free_blocks"] == 32)
    assert health["kv_cache"]["blocks"] == 32 and health["kv_cache"]["free_blocks"] == 32


def test_preemption_recomputes_instead_of_failing(small_pool: EngineServer) -> None:
    """Four concurrent requests that need ~10 blocks each at the end on a 32-block pool: the
    youngest are preempted (blocks freed, requeued, prompt and output so far prefilled again)
    and every one finishes with the text it gets two at a time, without preemption. (Counting:
    each greedy choice wins by a wide margin, so the recomputed cache's rounding, prefill's
    rather than decode's, cannot tip one; free text after an end-of-turn can.)"""
    url = small_pool.url
    asks = ["Count from 1 to 100, separated by commas.", "List the numbers from 200 to 300, separated by commas.",
            "Write the even numbers from 2 to 200, separated by commas.",
            "List the numbers from 1000 to 1100, separated by commas."]
    bodies = [{"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 120, "ignore_eos": True}
              for q in asks]
    before = _metric(url, "vllm:num_preemptions_total")
    with ThreadPoolExecutor(2) as pool:
        alone = [text for text, _, _ in pool.map(lambda b: _ask(url, b), bodies)]
    assert _metric(url, "vllm:num_preemptions_total") == before
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda b: post(url + "/v1/chat/completions", b), bodies))
    assert _metric(url, "vllm:num_preemptions_total") > before
    for (status, r), text in zip(together, alone, strict=True):
        assert status == 200, r
        assert r["usage"]["completion_tokens"] == 120
        assert r["choices"][0]["message"]["content"] == text
    health = _health_once(url, lambda kv: kv["usage"] == 0.0)
    assert health["kv_cache"]["preemptions"] >= 1 and health["kv_cache"]["usage"] == 0.0


def test_a_pool_that_cannot_hold_one_sequence_is_refused() -> None:
    from typer.testing import CliRunner

    from switchyard.cli import app

    r = CliRunner().invoke(app, ["engine", "serve", "--max-model-len", "1024", "--num-kv-blocks", "10"])
    assert r.exit_code == 2 and "at least 64 blocks of 16" in r.output, r.output
