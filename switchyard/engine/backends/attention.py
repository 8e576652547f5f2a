"""torch's attention over the paged KV cache, one of each, for the backends that attend in torch
(cpu where its native kernel cannot, torch): the new keys and values written as cache rows, a
row's blocks gathered into a span, a decode step over the spans, prompts through SDPA.

A layer's cache is [blocks, kv_heads, block_size, head_dim]; block tables [rows, n] say which
blocks hold each row's positions, in order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# (scores [S, Hkv, G, L], additive mask [S, 1, 1, L], scale, out dtype) -> probabilities
Softmax = Callable[[torch.Tensor, torch.Tensor, float, torch.dtype], torch.Tensor]


def head_rows(kv_heads: int, block_size: int, device: torch.device) -> torch.Tensor:
    """Each KV head's first row inside a block, when a layer's cache is viewed as rows: write_kv's."""
    return torch.arange(kv_heads, device=device) * block_size


def write_kv(kc: torch.Tensor, vc: torch.Tensor, blocks: torch.Tensor, offs: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, rows0: torch.Tensor) -> None:
    """Keys and values [N, kv_heads, head_dim] of N tokens into (block, offset) of one layer's
    cache: one index_copy_ each over the cache viewed as rows (on an H200, one copy kernel where
    advanced indexing took several)."""
    D, Hkv, bs = kc.shape[-1], kc.shape[1], kc.shape[2]
    rows = ((blocks * Hkv * bs + offs).view(-1, 1) + rows0).view(-1)
    kc.view(-1, D).index_copy_(0, rows, k.reshape(-1, D))
    vc.view(-1, D).index_copy_(0, rows, v.reshape(-1, D))


def gather(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """Rows' blocks [R, n] of one layer's cache as spans [R, kv_heads, n * block_size, head_dim]."""
    R, n = tables.shape
    _, Hkv, bs, D = cache.shape
    g = cache.index_select(0, tables.reshape(-1)).view(R, n, Hkv, bs, D)
    return g.transpose(1, 2).reshape(R, Hkv, n * bs, D)


def decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, softmax: Softmax,
           out: torch.dtype) -> torch.Tensor:
    """One query row per sequence, q [S, heads, D], over spans k, v [S, kv_heads, L, D] with an
    additive mask bias [S, 1, 1, L]: two batched matmuls around the softmax (on an H200 faster
    than memory-efficient SDPA for a handful of query rows per KV head). Returns [S * kv_heads, G, D]."""
    S, Hkv, L, D = k.shape
    G = q.shape[1] // Hkv
    s = torch.bmm(q.reshape(S * Hkv, G, D), k.view(S * Hkv, L, D).transpose(1, 2))
    p = softmax(s.view(S, Hkv, G, L), bias, 1.0 / D ** 0.5, out)
    return torch.bmm(p.view(S * Hkv, G, L), v.view(S * Hkv, L, D))


def prompt(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           kernels: list[SDPBackend] | None = None, gqa: bool = True) -> torch.Tensor:
    """Prompts, q [B, heads, T, D], k, v [B, kv_heads, T or L, D]: causal over their own keys
    (mask None: prompts from position 0) or over the cached span with `mask` [B, 1, T, L] (a prompt
    whose start is cached). kernels: the SDPA kernels to try in order (None: torch's choice)."""
    with sdpa_kernel(kernels) if kernels else contextlib.nullcontext():
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
