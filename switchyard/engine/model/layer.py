"""A decoder layer's weights on one rank: QKV and gate/up concatenated, norms float32, the
projections dense or int4 as model/linear.py makes them."""

from __future__ import annotations

import torch

from switchyard.engine.model.linear import Dense, Int4, make_linear


class Layer:
    __slots__ = ("ln1", "ln2", "qkv", "o", "gate_up", "down", "q_norm", "k_norm", "qk_norm")

    def __init__(self, w: dict[str, torch.Tensor], p: str, fmt: str, device: torch.device) -> None:
        def vec(name: str) -> torch.Tensor | None:
            t = w.get(p + name)
            return None if t is None else t.to(device=device, dtype=torch.float32)

        def proj(names: tuple[str, ...], bias: bool = False) -> Dense | Int4:
            ws = [w[p + n + ".weight"] for n in names]
            bs = [w.get(p + n + ".bias") for n in names] if bias else [None]
            b = torch.cat(bs) if bs[0] is not None else None  # type: ignore[arg-type]
            return make_linear(ws[0] if len(ws) == 1 else torch.cat(ws), b, fmt, device)

        self.ln1: torch.Tensor = vec("input_layernorm.weight")  # type: ignore[assignment]
        self.ln2: torch.Tensor = vec("post_attention_layernorm.weight")  # type: ignore[assignment]
        self.qkv = proj(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), bias=True)
        self.o = proj(("self_attn.o_proj",))
        self.gate_up = proj(("mlp.gate_proj", "mlp.up_proj"))
        self.down = proj(("mlp.down_proj",))
        self.q_norm = vec("self_attn.q_norm.weight")
        self.k_norm = vec("self_attn.k_norm.weight")
        # The fused GPU kernel reads both from one buffer.
        self.qk_norm = torch.cat((self.q_norm, self.k_norm)) if self.q_norm is not None and self.k_norm is not None \
            else None

