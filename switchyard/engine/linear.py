"""Weight formats for the projections: dense (float32/bfloat16) or int4 groups of 32.

int4 keeps 4 bits per weight plus a bfloat16 scale and offset per 32 weights, the layout of
the GGUF Q4_x files themselves, and runs through torch's CPU int4 matmul kernel with
bfloat16 activations: decode reads ~7x fewer weight bytes than float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GROUP = 32


class Dense:
    __slots__ = ("w", "b")

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype) -> None:
        self.w = w.to(dtype).contiguous()
        self.b = b.to(dtype) if b is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w, self.b)


def int4_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")


class Int4:
    """y = x @ dequant(W).T with W stored as uint4 codes, per-32 scale and offset."""

    __slots__ = ("packed", "sz", "b", "n")

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None) -> None:
        n, k = w.shape
        if k % GROUP:
            raise ValueError(f"int4 needs the input width to be a multiple of {GROUP}, got {k}")
        g = w.float().view(n, k // GROUP, GROUP)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp_min(1e-10)
        q = ((g - lo) / scale).round().clamp(0, 15).to(torch.int32).view(n, k)
        zero = lo + 8 * scale  # the kernel computes (q - 8) * scale + zero
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        self.sz = torch.stack([scale.view(n, -1).t(), zero.view(n, -1).t()], dim=-1).to(torch.bfloat16).contiguous()
        self.b = b.to(torch.bfloat16) if b is not None else None
        self.n = n

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, shape[-1]), self.packed, GROUP, self.sz)
        y = y.view(*shape[:-1], self.n)
        return y + self.b if self.b is not None else y


def make_linear(w: torch.Tensor, b: torch.Tensor | None, fmt: str) -> Dense | Int4:
    if fmt == "int4":
        if w.shape[1] % GROUP == 0:
            return Int4(w, b)
        fmt = "bfloat16"  # a shard too narrow for whole groups: same activations, dense weights
    return Dense(w, b, getattr(torch, fmt))
