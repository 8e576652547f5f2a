"""Tensor parallelism: TP=3 equals TP=1 on SmolLM2, random Llamas at TP=2/4 equal TP=1 (and
transformers), oneshot equals ring, `auto` falls back to ring when its test fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_support import SERVER_ARGS, EngineServer, get, post
from procs import ROOT, free_port

HARNESS = Path(__file__).resolve().parent / "tp_harness.py"
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]


def _ranks(world: int, args: list[str], timeout: float = 120.0) -> None:
    """The harness on `world` ranks. Once more on a new port if the ranks never met: free_port's
    port can be taken by another test's process before rank 0 binds it (a CI run's flake)."""
    for attempt in (1, 2):
        outs = _run_ranks(world, args, timeout)
        if outs is not None and all(rc == 0 for rc, _ in outs):
            return
        met = outs is not None and not any("TCPStore" in o and "failed to connect" in o for _, o in outs)
        if met or attempt == 2:
            break
    assert outs is not None, f"the ranks did not finish in {timeout:.0f} s"
    for rc, o in outs:
        assert rc == 0, o[-3000:]


def _run_ranks(world: int, args: list[str], timeout: float) -> list[tuple[int, str]] | None:
    """Each rank's exit status and output, or None if they did not finish in time."""
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, str(HARNESS), *args], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(world)]
    try:
        outs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
    except subprocess.TimeoutExpired:
        return None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, o) for p, o in zip(procs, outs, strict=True)]


@pytest.fixture(scope="module")
def server_tp3_forced_ring(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    """TP=3 with --collective auto and the oneshot start-up test forced to fail. Its prompts are
    prefilled 16 tokens a step (chunked prefill on every rank: 3-4 chunks a chat prompt, ~17 for
    the garden's); TP=1's in one step."""
    args = [a for a in SERVER_ARGS if a not in ("--collective", "ring")] + ["--collective", "auto",
                                                                             "--max-num-batched-tokens", "16"]
    s = EngineServer(gguf_path, tmp_path_factory.mktemp("tp3") / "engine.log", tp=3, extra=args,
                     env={"SWITCHYARD_ONESHOT_FORCE_FAIL": "1"})
    yield s
    s.close()


def _greedy(url: str, prompt: str) -> dict:
    status, body = post(url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 20,
        "logprobs": True, "top_logprobs": 5})
    assert status == 200, body
    return body["choices"][0]


def test_tp3_equals_tp1(server_tp1: EngineServer, server_tp3_forced_ring: EngineServer) -> None:
    for prompt in PROMPTS:
        one, three = _greedy(server_tp1.url, prompt), _greedy(server_tp3_forced_ring.url, prompt)
        assert one["message"]["content"] == three["message"]["content"]
        assert len(one["logprobs"]["content"]) >= 4
        for a, b in zip(one["logprobs"]["content"], three["logprobs"]["content"], strict=True):
            assert a["token"] == b["token"]
            # log-softmax of the logits, top 5: TP changes only the summation order
            for x, y in zip(a["top_logprobs"], b["top_logprobs"], strict=True):
                assert abs(x["logprob"] - y["logprob"]) < 2e-3, (prompt, a, b)


def test_tp3_prefix_cache_equals_tp1(server_tp1: EngineServer, server_tp3_forced_ring: EngineServer) -> None:
    """Rank 0's pool decides, every rank's cache follows the broadcast block tables: the second
    turn of a conversation reuses the first's blocks on all three ranks and answers as TP=1."""
    system = "You help with a garden. " + " ".join(f"Bed {i} has {i + 2} rows of beans and one of peas." for i in range(12))
    turn1 = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Which bed has 5 rows?"}],
             "temperature": 0, "max_tokens": 16}
    answers = {}
    for name, url in (("tp1", server_tp1.url), ("tp3", server_tp3_forced_ring.url)):
        status, r1 = post(url + "/v1/chat/completions", turn1)
        assert status == 200, r1
        turn2 = {**turn1, "messages": [*turn1["messages"], r1["choices"][0]["message"],
                                       {"role": "user", "content": "And which has 9?"}]}
        status, r2 = post(url + "/v1/chat/completions", turn2)
        assert status == 200, r2
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1["usage"]["prompt_tokens"] - 16
        answers[name] = (r1["choices"][0]["message"]["content"], r2["choices"][0]["message"]["content"])
    assert answers["tp3"] == answers["tp1"]
    status, health = get(server_tp3_forced_ring.url + "/health")
    assert health["kv_cache"]["prefix_cache_hits"] > 0


def test_auto_with_failed_oneshot_test_serves_with_ring(server_tp3_forced_ring: EngineServer) -> None:
    status, health = get(server_tp3_forced_ring.url + "/health")
    assert status == 200
    coll = health["collective"]
    assert coll["mode"] == "auto" and coll["chosen"] == "ring"
    assert "SWITCHYARD_ONESHOT_FORCE_FAIL" in coll["reason"]
    status, body = post(server_tp3_forced_ring.url + "/v1/completions",
                        {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert status == 200 and "Paris" in body["choices"][0]["text"]


def test_smollm2_refuses_tp2(gguf_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "switchyard.cli", "engine", "serve", "--model", str(gguf_path),
                        "--tp", "2", "--port", str(free_port())], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert p.returncode == 2
    assert "TP=2 does not fit" in p.stderr and "1, 3" in p.stderr


def _random_llama(d: Path) -> Path:
    from safetensors.torch import save_file

    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "max_position_embeddings": 128, "tie_word_embeddings": False,
           "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "torch_dtype": "float32"}
    g = torch.Generator().manual_seed(0)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    t = {"model.embed_tokens.weight": w(256, 64), "model.norm.weight": 1 + w(64), "lm_head.weight": w(256, 64)}
    for i in range(2):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": 1 + w(64), p + "post_attention_layernorm.weight": 1 + w(64),
              p + "self_attn.q_proj.weight": w(64, 64), p + "self_attn.k_proj.weight": w(16, 64),
              p + "self_attn.v_proj.weight": w(16, 64), p + "self_attn.o_proj.weight": w(64, 64),
              p + "mlp.gate_proj.weight": w(128, 64), p + "mlp.up_proj.weight": w(128, 64),
              p + "mlp.down_proj.weight": w(64, 128)}
    d.mkdir(parents=True, exist_ok=True)
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_random_llama_tp2_tp4_equal_tp1(tmp_path: Path) -> None:
    """8 heads / 2 KV heads: TP=2 splits the KV heads, TP=4 replicates them."""
    model = _random_llama(tmp_path / "llama")
    runs = {}
    for tp, coll in ((1, "ring"), (2, "ring"), (4, "oneshot")):
        out = tmp_path / f"tp{tp}.pt"
        _ranks(tp, ["model", str(model), str(out), coll])
        runs[tp] = torch.load(out)["logits"]
    for tp in (2, 4):
        assert torch.equal(runs[1].argmax(-1), runs[tp].argmax(-1))
        torch.testing.assert_close(runs[tp], runs[1], atol=1e-4, rtol=1e-4)
    # And TP=1 itself against transformers reading the same safetensors (prefill, last token).
    from tp_harness import PROMPTS as P
    from transformers import LlamaForCausalLM

    ref = LlamaForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    with torch.inference_mode():
        for i, prompt in enumerate(P):
            expect = ref(torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(runs[1][0, i], expect, atol=1e-4, rtol=1e-4)


def test_oneshot_equals_ring_and_auto(tmp_path: Path) -> None:
    out = tmp_path / "comm.json"
    _ranks(3, ["comm", str(out)])
    found = json.loads(out.read_text())
    assert found["exact_equal"], "oneshot must equal ring bit for bit on exact-valued inputs"
    assert found["ranks_identical"], "oneshot must give every rank the same bytes"
    auto = found["auto"]
    assert auto["mode"] == "auto" and auto["chosen"] in ("oneshot+ring", "ring")
    assert [row["bytes"] for row in auto["sweep"]] == [1 << k for k in range(10, 23)]
    if auto["chosen"] == "oneshot+ring":
        assert auto["oneshot_up_to_bytes"] >= 1024
