"""Triton kernels of the GPU steps whose projections run through cuBLAS (a prefill, and a decode
step past the fused rows): RoPE (with Qwen3's q/k norm) splitting the QKV projection into q, k, v
and writing k and v into the cache (prefill), SiLU(gate) * up, and the residual add with the next
RMSNorm (at decode, torch's compiled dynamic-shape kernels for these two took 4-4.7 us where these
take about half, on an 8B step of 16-64 rows on an H100, bench/results/gpu_peer_8b; a prefill
takes them too); and a fused decode step's final RMSNorm."""

from __future__ import annotations

# isort: off
from switchyard.engine.backends.cuda import triton_common  # noqa: F401  (sets TRITON_INTERPRET first)
import torch
import triton
import triton.language as tl
# isort: on


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, INTER, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < INTER
    g = tl.load(gu_ptr + row * 2 * INTER + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * INTER + INTER + c, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * INTER + c, (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty), mask=m)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of a fused [N, 2 I] gate_up output -> [N, I] (computed in float32)."""
    n, inter = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(n, inter, dtype=gu.dtype, device=gu.device)
    block = min(2048, triton.next_power_of_2(inter))
    _silu_mul_kernel[(n, triton.cdiv(inter, block))](gu, out, inter, BLOCK=block, num_warps=4)
    return out


@triton.jit
def _add_rms_kernel(x_ptr, y_ptr, w_ptr, xo_ptr, h_ptr, lo_ptr, N, eps, BLOCK: tl.constexpr, ADD: tl.constexpr,
                    LOW: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    m = c < N
    x = tl.load(x_ptr + row * N + c, mask=m, other=0.0).to(tl.float32)
    if ADD:
        x += tl.load(y_ptr + row * N + c, mask=m, other=0.0).to(tl.float32)
        tl.store(xo_ptr + row * N + c, x, mask=m)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
    h = w * (x * r)
    tl.store(h_ptr + row * N + c, h.to(h_ptr.dtype.element_ty), mask=m)
    if LOW:  # also in a second dtype (the LM head's input beside the refinement's float32)
        tl.store(lo_ptr + row * N + c, h.to(lo_ptr.dtype.element_ty), mask=m)


def add_rms(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, eps: float,
            out: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """torch_ops.add_rms in one kernel, a program a row: (x + y in float32, RMSNorm of it cast to
    `out`). x float32, y any float dtype, both contiguous and of one shape [..., N]."""
    xo = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    return xo, _rms(x, y, w, xo, eps, out)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.dtype,
             low: torch.Tensor | None = None) -> torch.Tensor:
    """torch_ops.rms_norm in one kernel, a program a row (torch's ops take six launches: a decode
    step's final norm). x float32, contiguous, [..., N]. low: x's shape, also given the norm, cast
    to its dtype (a decode step's LM head input: the cast's launch, ~1.6 us of SmolLM2's batch-1
    step on an H100, saved)."""
    return _rms(x, None, w, None, eps, out, low)


def _rms(x: torch.Tensor, y: torch.Tensor | None, w: torch.Tensor, xo: torch.Tensor | None, eps: float,
         out: torch.dtype, low: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x (+ y, written to xo, where y is given) cast to `out` (and to low's dtype, into
    low), a program a row."""
    n = x.shape[-1]
    h = torch.empty(x.shape, dtype=out, device=x.device)
    assert low is None or (low.shape == x.shape and low.is_contiguous()), "low: x's shape, contiguous"
    block = triton.next_power_of_2(n)
    add = y is not None
    _add_rms_kernel[(x.numel() // n,)](x, y if add else x, w, xo if add else x, h, low if low is not None else h, n,
                                       eps, BLOCK=block, ADD=add, LOW=low is not None,
                                       num_warps=8 if block >= 4096 else 4)
    return h


@triton.jit
def _rope_split_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, qkn_ptr, q_ptr, k_ptr, v_ptr, slot_ptr, kc_ptr, vc_ptr,
                       eps, H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HB: tl.constexpr,
                       QK_NORM: tl.constexpr, WRITE: tl.constexpr, BS: tl.constexpr):
    # Program (token, head block): HB heads of one token's fused QKV row, rotated (q, k) and
    # written to q [N, H, D], k and v [N, HKV, D]; with WRITE, k and v also into the cache
    # [blocks, HKV, BS, D] at the token's slot (block * BS + offset; < 0: padding, not written).
    tok = tl.program_id(0).to(tl.int64)
    hs = tl.program_id(1) * HB + tl.arange(0, HB)
    NH: tl.constexpr = H + 2 * HKV
    HALF: tl.constexpr = D // 2
    d = tl.arange(0, HALF)
    live = (hs < NH)[:, None]
    at = qkv_ptr + tok * NH * D + hs[:, None] * D + d[None, :]
    x1 = tl.load(at, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(at + HALF, mask=live, other=0.0).to(tl.float32)
    rot = (hs < H + HKV)[:, None]
    if QK_NORM:
        inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)
        nw = qkn_ptr + (hs >= H).to(tl.int32)[:, None] * D + d[None, :]  # q_norm's weights, then k_norm's
        x1 = tl.where(rot, x1 * inv[:, None] * tl.load(nw, mask=rot & live, other=1.0), x1)
        x2 = tl.where(rot, x2 * inv[:, None] * tl.load(nw + HALF, mask=rot & live, other=1.0), x2)
    p = tl.load(pos_ptr + tok)
    c = tl.load(cos_ptr + p * D + d)[None, :]
    s = tl.load(sin_ptr + p * D + d)[None, :]
    o1 = tl.where(rot, x1 * c - x2 * s, x1)
    o2 = tl.where(rot, x2 * c + x1 * s, x2)
    odt = q_ptr.dtype.element_ty
    is_q = (hs < H)[:, None]
    is_k = rot & ~is_q
    is_v = live & ~rot
    qa = q_ptr + tok * H * D + hs[:, None] * D + d[None, :]
    ka = k_ptr + tok * HKV * D + (hs - H)[:, None] * D + d[None, :]
    va = v_ptr + tok * HKV * D + (hs - H - HKV)[:, None] * D + d[None, :]
    tl.store(qa, o1.to(odt), mask=is_q)
    tl.store(qa + HALF, o2.to(odt), mask=is_q)
    tl.store(ka, o1.to(odt), mask=is_k)
    tl.store(ka + HALF, o2.to(odt), mask=is_k)
    tl.store(va, o1.to(odt), mask=is_v)
    tl.store(va + HALF, o2.to(odt), mask=is_v)
    if WRITE:
        slot = tl.load(slot_ptr + tok)
        kv = tl.where(is_k, hs[:, None] - H, hs[:, None] - H - HKV)  # the KV head, k's or v's
        at = ((slot // BS * HKV + kv) * BS + slot % BS) * D + d[None, :]
        put_k, put_v = is_k & (slot >= 0), is_v & (slot >= 0)
        tl.store(kc_ptr + at, o1.to(odt), mask=put_k)
        tl.store(kc_ptr + at + HALF, o2.to(odt), mask=put_k)
        tl.store(vc_ptr + at, o1.to(odt), mask=put_v)
        tl.store(vc_ptr + at + HALF, o2.to(odt), mask=put_v)


def rope_split(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, heads: int,
               kv_heads: int, head_dim: int, qk_norm: torch.Tensor | None, eps: float,
               cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """cuda_ops.rope_qkv for a prefill: qkv [N, (H + 2 Hkv) D] in the model dtype, cos/sin the
    whole [max_len, D] tables, pos [N]; qk_norm as qkv_rope's. Returns q [N,H,D], k, v [N,Hkv,D].
    cache: (k_cache, v_cache, slots [N]): k and v also written into one layer's cache
    [blocks, Hkv, block_size, D] at each token's slot (block * block_size + offset; -1: padding,
    not written). That write was two gathers of the unpadded rows and two index copies a layer
    (3.1 ms of an 8B model's 8k prefill on an H100, bench/results/gpu_fill_lanes call 9)."""
    n = qkv.shape[0]
    q = torch.empty(n, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(n, kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    v = torch.empty_like(k)
    kc, vc, slots = cache if cache is not None else (k, v, pos)
    hb = 8
    _rope_split_kernel[(n, triton.cdiv(heads + 2 * kv_heads, hb))](
        qkv, cos, sin, pos, qk_norm if qk_norm is not None else cos, q, k, v, slots, kc, vc, eps, H=heads,
        HKV=kv_heads, D=head_dim, HB=hb, QK_NORM=qk_norm is not None, WRITE=cache is not None,
        BS=kc.shape[-2] if cache is not None else 1, num_warps=4)
    return q, k, v
