"""Weight formats for the projections: dense (float32/bfloat16) or int4 groups of 32.

int4 keeps 4 bits per weight plus a scale and offset per 32 weights, the layout of the GGUF
Q4_x files themselves, with bfloat16 activations: decode reads ~7x fewer weight bytes than
float32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from switchyard.engine.backends.cpu.native import Int4Weight, build_named
from switchyard.engine.backends.cpu.native import load as load_native
from switchyard.engine.errors import KernelError

GROUP = 32
NATIVE_COLS = 16  # output columns per block of the native kernel


class Dense:
    __slots__ = ("w", "b", "fp8")

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype,
                 device: torch.device | None = None) -> None:
        self.w = w.to(device=device, dtype=dtype).contiguous()
        self.b = b.to(device=device, dtype=dtype) if b is not None else None
        # An FP8 copy for long prefills on a GPU (--prefill-fp8: backends/cuda/fp8.attach), else None.
        self.fp8: Any = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.w.dtype), self.w, self.b)


def int4_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")


class Int4:
    """y = x @ dequant(W).T with W stored as uint4 codes and a scale and minimum per 32 weights
    (GGUF Q4_1's scheme: a Q4_1 file's weights are reproduced exactly).

    Runs on our kernel (engine/native) when this CPU and a C compiler allow it: float32 in
    and out (the AVX512-BF16 build rounds x to bfloat16 inside, the AVX2 build stays float32),
    faster than torch's kernel once a step has several rows, and each row's result does not
    depend on the batch it is in. The AVX2 and AVX512-BF16 builds keep each group's scale and
    minimum in float16 beside its codes, as Q4_1 does (0.625 bytes a weight, read as one
    stream); the AMX build keeps them in float32 apart from the codes.
    Otherwise on torch's kernel: bfloat16 in and out, bfloat16 scales and offsets.
    """

    __slots__ = ("packed", "sz", "s", "z", "b", "n", "k", "native", "weight")

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None) -> None:
        n, k = w.shape
        if k % GROUP:
            raise ValueError(f"int4 needs the input width to be a multiple of {GROUP}, got {k}")
        g = w.float().view(n, k // GROUP, GROUP)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        lib, name = load_native()
        self.n, self.k = n, k
        self.native = lib.sy_int4_mm if lib is not None and n % NATIVE_COLS == 0 else None
        records = self.native is not None and build_named(name).int4_records
        if records:  # the scale and minimum as float16 first, the codes against those
            lo, scale = lo.half().float(), ((hi - lo) / 15).half().float()
        else:
            scale = ((hi - lo) / 15).clamp_min(1e-10)
        q = ((g - lo) / scale.clamp_min(1e-10)).round().clamp(0, 15).to(torch.uint8).view(n, k)
        self.b = None if b is None else b.float() if self.native is not None else b.to(torch.bfloat16)
        self.s = self.z = self.sz = None
        if records:
            self.packed = _pack_records(q, scale.view(n, -1), lo.view(n, -1))
        elif self.native is not None:
            zero = lo + 8 * scale  # the AMX kernel computes (q - 8) * scale + zero
            self.packed = _pack_native(q)
            self.s = scale.view(n, -1).t().contiguous()  # [groups, n] float32
            self.z = zero.view(n, -1).t().contiguous()
        else:
            zero = lo + 8 * scale  # torch's kernel computes (q - 8) * scale + zero
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
            self.sz = torch.stack([scale.view(n, -1).t(), zero.view(n, -1).t()], dim=-1).to(
                torch.bfloat16).contiguous()
        # What the fused layer calls (native/layer.c) take; the tensors above keep it valid.
        self.weight: Int4Weight | None = None if self.native is None else Int4Weight(
            self.packed.data_ptr(), 0 if self.s is None else self.s.data_ptr(),
            0 if self.z is None else self.z.data_ptr(), n, k)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.native is not None:  # float32 in and out; bfloat16 inside
            x2 = x2.float().contiguous()
            y = torch.empty(x2.shape[0], self.n)
            assert self.weight is not None
            if self.native(x2.data_ptr(), self.weight.w, self.weight.s, self.weight.z,
                           y.data_ptr(), x2.shape[0], self.n, self.k, torch.get_num_threads()):
                raise KernelError("native int4 matmul failed: out of memory")  # shapes are checked at load
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.to(torch.bfloat16), self.packed, GROUP, self.sz)
        y = y.view(*shape[:-1], self.n)
        return y + self.b if self.b is not None else y


def _pack_native(q: torch.Tensor) -> torch.Tensor:
    """Codes [n, k] into the native kernels' layout: per 16 columns, per group, per t in 0..7, 32
    bytes; byte 2i+e holds column i's code for k = 4t+e (low nibble), 4t+2+e (high nibble)."""
    n, k = q.shape
    p = q.view(n // NATIVE_COLS, NATIVE_COLS, k // GROUP, 8, 2, 2)  # (block, i, group, t, nibble, e)
    p = p.permute(0, 2, 3, 1, 5, 4)  # (block, group, t, i, e, nibble)
    return (p[..., 0] | (p[..., 1] << 4)).contiguous()


def _pack_records(q: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """Codes [n, k] with float16-exact scales and minimums [n, groups] into records: per 16
    columns, per group, the codes as _pack_native lays them (256 bytes), the 16 scales and the
    16 minimums as float16 (32 bytes each)."""
    n, k = q.shape
    blocks, groups = n // NATIVE_COLS, k // GROUP
    codes = _pack_native(q).view(blocks, groups, NATIVE_COLS * GROUP // 2)

    def halves(v: torch.Tensor) -> torch.Tensor:  # [n, groups] -> [blocks, groups, 32] bytes
        return v.half().view(blocks, NATIVE_COLS, groups).transpose(1, 2).contiguous().view(torch.uint8)

    return torch.cat([codes, halves(scale), halves(lo)], dim=-1).contiguous()


def int4_kernel() -> str:
    lib, what = load_native()  # the build's name, or why there is none
    return f"native {what}" if lib is not None else f"torch ({what})"


def make_linear(w: torch.Tensor, b: torch.Tensor | None, fmt: str, device: torch.device | None = None) -> Dense | Int4:
    """fmt: int4 (CPU) or a dense dtype's name; dense weights go to `device` (None: where they are)."""
    if fmt == "int4":
        if w.shape[1] % GROUP == 0:
            return Int4(w, b)
        fmt = "bfloat16"  # a shard too narrow for whole groups: same activations, dense weights
    return Dense(w, b, getattr(torch, fmt), device)
