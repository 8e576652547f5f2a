"""What the decoders share: RoPE frequencies and tables, the vocab-parallel embedding, and how
many logits per row are recomputed exactly after a low-precision LM head."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from switchyard.engine.model.config import ModelConfig
from switchyard.engine.model.parallel import CollectiveBackend
from switchyard.engine.model.weights import Shard

REFINE = 32  # candidates per row whose logits are recomputed in float32 after a low-precision head


def rope_inv_freq(c: ModelConfig, freqs_factor: torch.Tensor | None = None) -> torch.Tensor:
    d = c.head_dim
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = c.rope_scaling
    if freqs_factor is not None:
        inv = inv / freqs_factor.to(torch.float64)
    elif rs.get("rope_type", rs.get("type")) == "llama3":
        factor = float(rs.get("factor", 8.0))
        low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
        old = float(rs.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        mid = (wavelen <= old / low) & (wavelen >= old / high)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv.to(torch.float32)


def rope_tables(inv_freq: torch.Tensor, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions, head_dim] float32, each frequency twice (rotate-half layout)."""
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def embed_tokens(ids: torch.Tensor, embed: torch.Tensor, shard: Shard, comm: CollectiveBackend) -> torch.Tensor:
    """Rows of the (float32) embedding; with TP each rank holds a slice of the vocabulary, fills
    the rows it has, zeroes the others, and one all-reduce completes them."""
    if shard.tp == 1:
        return F.embedding(ids, embed).float()
    lo, hi = shard.vocab_rows
    local = ids - lo
    inside = (local >= 0) & (local < hi - lo)
    x = F.embedding(local.clamp(0, hi - lo - 1), embed).float() * inside.unsqueeze(-1)
    return comm.all_reduce(x)
