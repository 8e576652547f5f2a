"""The row-wise steps between a layer's matmuls: RMSNorm (with the residual add), SwiGLU, RoPE;
and the logits' top-k (argmax for k = 1).

On float32 CPU tensors with the native kernels loaded, each is one call into
`native/rowops.c`; otherwise torch's ops, as HF computes them. Both give the same values up
to float32 rounding.
"""

from __future__ import annotations

import ctypes

import torch

from switchyard.engine.backends.torch_ops import rms_norm, rotate, silu_mul
from switchyard.engine.errors import KernelError

F32 = torch.float32


def rms_norm_torch(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.dtype | None = None) -> torch.Tensor:
    """torch_ops.rms_norm (float32 weights: the norms' always are), in w's dtype unless `out` says."""
    return rms_norm(x, w, eps, out or w.dtype)


def _native_ok(*ts: torch.Tensor) -> bool:
    return all(t.dtype == F32 and t.device.type == "cpu" and t.is_contiguous() for t in ts)


def topk_indices(lib: ctypes.CDLL | None, x: torch.Tensor, k: int) -> torch.Tensor:
    """See RowOps.topk; also the sampler's argmax (k = 1) over a step's logits."""
    if lib is not None and _native_ok(x) and x.dim() == 2 and 1 <= k <= min(64, x.shape[-1]):
        idx = torch.empty(x.shape[0], k, dtype=torch.int64)
        if not lib.sy_topk(x.data_ptr(), x.shape[0], x.shape[1], k, idx.data_ptr(), torch.get_num_threads()):
            return idx
        # else a row with fewer than k values that are not NaN: torch's answer
    # argmax promises the first of tied maxima; topk (on GPUs) promises no order among ties.
    return x.argmax(dim=-1, keepdim=True) if k == 1 else x.topk(k, dim=-1).indices


class RowOps:
    """`lib`: the native library, or None for torch's ops throughout."""

    def __init__(self, lib: ctypes.CDLL | None, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.lib = lib
        self.cos, self.sin = cos.contiguous(), sin.contiguous()  # [max_len, head_dim]

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.dtype | None = None) -> torch.Tensor:
        h = self._native_norm(x, None, w, eps, out)
        return h if h is not None else rms_norm_torch(x, w, eps, out)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float,
                     out: torch.dtype | None = None) -> torch.Tensor:
        """x += delta (in place: the residual stream), then RMSNorm(x)."""
        h = self._native_norm(x, delta, w, eps, out)
        if h is not None:
            return h
        x.add_(delta)
        return rms_norm_torch(x, w, eps, out)

    def _native_norm(self, x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float,
                     out: torch.dtype | None) -> torch.Tensor | None:
        """One native call (adding delta into x first, when given), or None where it can't run."""
        if self.lib is None or out not in (None, F32) or x.shape[-1] % 16 or not _native_ok(x, w):
            return None
        if delta is not None and not _native_ok(delta):
            return None
        h = torch.empty_like(x)
        self._check(self.lib.sy_add_rmsnorm(x.data_ptr(), None if delta is None else delta.data_ptr(), w.data_ptr(),
                                            eps, h.data_ptr(), x.numel() // x.shape[-1], x.shape[-1],
                                            torch.get_num_threads()))
        return h

    def silu_mul(self, gu: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up, from gate/up's output [..., 2I]."""
        if self.lib is not None and gu.shape[-1] % 16 == 0 and _native_ok(gu):
            inter = gu.shape[-1] // 2
            out = gu.new_empty(*gu.shape[:-1], inter)
            self._check(self.lib.sy_silu_mul(gu.data_ptr(), out.data_ptr(), gu.numel() // gu.shape[-1], inter,
                                             torch.get_num_threads()))
            return out
        return silu_mul(gu)

    def rope_(self, qkv: torch.Tensor, positions: torch.Tensor, heads: int, head_dim: int) -> bool:
        """Rotate the first `heads` heads of each row of qkv [B, T, width] in place, at
        positions [B, T]. False (nothing done) where the caller must rotate in torch (torch_ops.rotate)."""
        if self.lib is None or not _native_ok(qkv) or positions.dtype != torch.int64:
            return False
        pos = positions.contiguous()
        rows = qkv.numel() // qkv.shape[-1]
        self._check(self.lib.sy_rope(qkv.data_ptr(), rows, qkv.shape[-1], heads, head_dim, self.cos.data_ptr(),
                                     self.sin.data_ptr(), pos.data_ptr(), self.cos.shape[0], torch.get_num_threads()))
        return True

    def topk(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Indices [rows, k] of each row's k largest values, largest first, ties to the lower
        index (torch's topk does not promise which of tied values it keeps)."""
        return topk_indices(self.lib, x, k)

    def gather_dot(self, w: torch.Tensor, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """out[m, j] = w[idx[m, j]] . h[m], float32: the exact logits of each row's candidates."""
        if self.lib is not None and _native_ok(w, h) and idx.dtype == torch.int64 and w.shape[-1] % 16 == 0:
            idx = idx.contiguous()
            out = torch.empty(idx.shape, dtype=F32)
            self._check(self.lib.sy_gather_dot(w.data_ptr(), h.data_ptr(), idx.data_ptr(), out.data_ptr(), idx.shape[0],
                                               idx.shape[1], w.shape[1], w.shape[0], torch.get_num_threads()))
            return out
        return torch.bmm(w[idx], h.unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def _check(rc: int) -> None:
        if rc:
            # 1 is ruled out before each call; 2 is a caller's position past max_len.
            why = {1: "row width not a multiple of 16", 2: "position or row index out of range"}
            raise KernelError(f"native row op failed: {why.get(rc, rc)}")


rotate_torch = rotate  # the tests' name for torch's RoPE
