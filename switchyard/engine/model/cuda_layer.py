"""A decoder layer's weights on the GPU (QKV and gate/up concatenated, norms in float32), and
how many bytes of them a batch-1 decode step reads (the benches' bandwidth bound)."""

from __future__ import annotations

from typing import Any

import torch

from switchyard.engine.model.common import REFINE

# `m` below is a CudaModel, not imported: cuda_decoder imports this module.
CudaModel = Any


class CudaLayer:
    __slots__ = ("ln1", "ln2", "qkv", "qkv_b", "o", "gate_up", "down", "q_norm", "k_norm", "qk_norm")

    def __init__(self, w: dict[str, torch.Tensor], p: str, dev: torch.device, dt: torch.dtype) -> None:
        def mat(*names: str) -> torch.Tensor:
            parts = [w[p + n] for n in names]
            t = parts[0] if len(parts) == 1 else torch.cat(parts)
            return t.to(device=dev, dtype=dt).contiguous()

        def vec(name: str) -> torch.Tensor | None:
            t = w.get(p + name)
            return None if t is None else t.to(device=dev, dtype=torch.float32)

        self.ln1 = vec("input_layernorm.weight")
        self.ln2 = vec("post_attention_layernorm.weight")
        self.qkv = mat("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
        bias = [w.get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
        self.qkv_b = torch.cat(bias).to(device=dev, dtype=dt) if bias[0] is not None else None  # type: ignore[arg-type]
        self.o = mat("self_attn.o_proj.weight")
        self.gate_up = mat("mlp.gate_proj.weight", "mlp.up_proj.weight")
        self.down = mat("mlp.down_proj.weight")
        self.q_norm = vec("self_attn.q_norm.weight")
        self.k_norm = vec("self_attn.k_norm.weight")
        # The fused kernel reads both from one buffer.
        self.qk_norm = torch.cat((self.q_norm, self.k_norm)) if self.q_norm is not None and self.k_norm is not None \
            else None


def weight_bytes_per_token(m: CudaModel) -> int:
    """Bytes a batch-1 decode step must read: every projection, the norms, the low-precision
    LM head, one embedding row and the refined LM-head rows."""
    n = 0
    for layer in m.layers:
        for t in (layer.qkv, layer.o, layer.gate_up, layer.down, layer.ln1, layer.ln2, layer.qkv_b):
            if t is not None:
                n += t.numel() * t.element_size()
    head = m.lm_head_lowp if m.lm_head_lowp is not None else m.lm_head
    n += head.numel() * head.element_size() + m.norm.numel() * 4
    n += (1 + (REFINE if m.lm_head_lowp is not None else 0)) * m.embed.shape[1] * 4
    return n
