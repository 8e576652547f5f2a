"""Random Llama-family weights of real models' shapes, for tests and GPU benchmarks that
cannot carry the real files (a device run carries at most 64 MiB; the 8B shape is 16 GB).
Decode speed depends on the shapes, not on the values."""

from __future__ import annotations

import torch

from switchyard.engine.model.config import ModelConfig

SMOLLM2_135M = ModelConfig(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                           num_heads=9, num_kv_heads=3, head_dim=64, rms_eps=1e-5, rope_theta=100000.0,
                           max_position=8192, tie_embeddings=True, bos_token_id=1, eos_token_ids=(2,))
LLAMA_8B = ModelConfig(arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                       num_heads=32, num_kv_heads=8, head_dim=128, rms_eps=1e-5, rope_theta=500000.0,
                       max_position=131072, tie_embeddings=False, bos_token_id=128000, eos_token_ids=(128009,))
# "tiny": SmolLM2's widths with 2 layers, for smoke runs on CPU.
SHAPES = {"smollm2-135m": SMOLLM2_135M, "llama-8b": LLAMA_8B,
          "tiny": ModelConfig(**{**SMOLLM2_135M.__dict__, "num_layers": 2})}


def weight_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical (HF, without `model.`) names and shapes of a TP=1 checkpoint."""
    d, q, kv = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    out: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (c.vocab_size, d), "norm.weight": (d,)}
    if not c.tie_embeddings:
        out["lm_head.weight"] = (c.vocab_size, d)
    for i in range(c.num_layers):
        p = f"layers.{i}."
        out |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                p + "mlp.gate_proj.weight": (c.intermediate_size, d), p + "mlp.up_proj.weight": (c.intermediate_size, d),
                p + "mlp.down_proj.weight": (d, c.intermediate_size)}
        if c.qkv_bias:
            out |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,)}
        if c.qk_norm:
            out |= {p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,)}
    return out


def random_weights(c: ModelConfig, seed: int = 0, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Normal(0, std) matrices, norms near 1; deterministic for a seed on a given device."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    out = {}
    for name, shape in weight_shapes(c).items():
        if len(shape) == 1 and "bias" not in name:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        else:
            t = torch.randn(shape, generator=g, device=device, dtype=torch.float32).mul_(std)
        out[name] = t.to(dtype)
    return out
