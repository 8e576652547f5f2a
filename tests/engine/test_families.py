"""Config switches of the Llama family against transformers on small random checkpoints:
Qwen2 (QKV bias), Qwen3 (q/k RMSNorm, explicit head_dim), Llama 3 RoPE scaling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch


def _checkpoint(d: Path, model_type: str, extra: dict) -> Path:
    from safetensors.torch import save_file

    cfg = {"model_type": model_type, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": True,
           "hidden_act": "silu", "torch_dtype": "float32", **extra}
    head_dim = cfg.get("head_dim", 16)
    q, kv = 4 * head_dim, 2 * head_dim
    g = torch.Generator().manual_seed(1)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    t = {"model.embed_tokens.weight": w(128, 64), "model.norm.weight": 1 + w(64)}
    for i in range(2):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": 1 + w(64), p + "post_attention_layernorm.weight": 1 + w(64),
              p + "self_attn.q_proj.weight": w(q, 64), p + "self_attn.k_proj.weight": w(kv, 64),
              p + "self_attn.v_proj.weight": w(kv, 64), p + "self_attn.o_proj.weight": w(64, q),
              p + "mlp.gate_proj.weight": w(96, 64), p + "mlp.up_proj.weight": w(96, 64),
              p + "mlp.down_proj.weight": w(64, 96)}
        if model_type == "qwen2":
            t |= {p + "self_attn.q_proj.bias": w(q), p + "self_attn.k_proj.bias": w(kv),
                  p + "self_attn.v_proj.bias": w(kv)}
        if model_type == "qwen3":
            t |= {p + "self_attn.q_norm.weight": 1 + w(head_dim), p + "self_attn.k_norm.weight": 1 + w(head_dim)}
    d.mkdir(parents=True, exist_ok=True)
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    return d


CASES = {
    "qwen2-bias": ("qwen2", {"attention_bias": True}),
    "qwen3-qk-norm": ("qwen3", {"head_dim": 24}),
    "llama3-rope": ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_family_matches_transformers(case: str, tmp_path: Path, one_thread: None) -> None:
    from transformers import AutoModelForCausalLM

    from switchyard.engine.model.decoder import Decoder
    from switchyard.engine.model.step import Step
    from switchyard.engine.model.weights import Shard, load_shard, open_source
    from switchyard.engine.runner.comm import SingleRank

    model_type, extra = CASES[case]
    d = _checkpoint(tmp_path / case, model_type, extra)
    src = open_source(d)
    ours = Decoder(src.config, Shard(0, 1, src.config), load_shard(src, 0, 1), SingleRank(), 1, 160)
    ref = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    prompt = torch.randint(0, 128, (1, 100), generator=torch.Generator().manual_seed(2))
    T = prompt.shape[1]
    with torch.inference_mode():
        got = [ours.forward(Step(prompt, torch.arange(T).unsqueeze(0), torch.tensor([0]), torch.tensor([T]),
                            torch.tensor([T]), 1))[0]]
        seq = prompt[0].tolist()
        for _ in range(3):
            seq.append(int(got[-1].argmax()))
            n = len(seq)
            got.append(ours.forward(Step(torch.tensor([[seq[-1]]]), torch.tensor([[n - 1]]), torch.tensor([0]),
                                    torch.tensor([1]), torch.tensor([n]), 1))[0])
        expect = ref(torch.tensor([seq])).logits[0, T - 1:]
    torch.testing.assert_close(torch.stack(got), expect, atol=1e-4, rtol=1e-4)
