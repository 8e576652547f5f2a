"""Kernel 2 of a GPU decode layer (kernels.py), and the attention of every decode step of the
cuda backend: one query row per program against its cached positions, read in place through
the block table (no gather); long spans split over programs until the launch fills the GPU,
then a combine."""

from __future__ import annotations

# isort: off
from switchyard.engine.backends.cuda.triton_common import _UPCAST, _dot, _pdl_start, _pdl_wait  # sets TRITON_INTERPRET first
import torch
import triton
import triton.language as tl
# isort: on


@triton.jit
def _attention_kernel(q_ptr, kc_ptr, vc_ptr, tables_ptr, stride_t, ctx_ptr, o_ptr, mo_ptr, ml_ptr, sm_scale,
                      H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                      GP: tl.constexpr, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                      UPCAST: tl.constexpr, PDL: tl.constexpr):
    # Program (row, kv head, split): the kv head's G query heads (padded to GP rows for tl.dot)
    # over positions [split * CHUNK, (split + 1) * CHUNK) of the row's context.
    _pdl_start(PDL)
    _pdl_wait(PDL)  # q and this step's keys and values are the kernel before's
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    G: tl.constexpr = H // HKV
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    heads = kvh * G + g
    q = tl.load(q_ptr + row * (H * D) + heads[:, None] * D + d[None, :], mask=(g < G)[:, None], other=0.0)
    n_ctx = tl.maximum(tl.load(ctx_ptr + row), 1)  # an idle slot sees position 0 of the spare block
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, n_ctx)
    m_i = tl.full([GP], -1.0e30, dtype=tl.float32)  # finite: a fully masked tile keeps alpha at 1, not NaN
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, D], dtype=tl.float32)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        valid = t < end
        blk = tl.load(tables_ptr + row * stride_t + t // BS, mask=valid, other=0)
        at = ((blk * HKV + kvh) * BS + t % BS)[:, None] * D + d[None, :]
        k = tl.load(kc_ptr + at, mask=valid[:, None], other=0.0)
        v = tl.load(vc_ptr + at, mask=valid[:, None], other=0.0)
        s = _dot(q, tl.trans(k), tl.zeros([GP, BLOCK_N], dtype=tl.float32), UPCAST) * sm_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
        m_i = m_new
    live = (g < G)[:, None]
    if SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(o_ptr + row * (H * D) + heads[:, None] * D + d[None, :], out.to(o_ptr.dtype.element_ty), mask=live)
    else:
        part = (row * H + heads) * SPLITS + split
        tl.store(mo_ptr + part[:, None] * D + d[None, :], acc, mask=live)
        tl.store(ml_ptr + part * 2, m_i, mask=g < G)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=g < G)


@triton.jit
def _combine_kernel(mo_ptr, ml_ptr, o_ptr, H: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
                    PDL: tl.constexpr):
    # Program (row, head): the splits' partial sums rescaled to their common maximum.
    _pdl_start(PDL)
    _pdl_wait(PDL)
    row = tl.program_id(0)
    head = tl.program_id(1)
    sp = tl.arange(0, SPLITS)
    d = tl.arange(0, D)
    base = (row * H + head) * SPLITS
    m = tl.load(ml_ptr + (base + sp) * 2)
    lsum = tl.load(ml_ptr + (base + sp) * 2 + 1)
    w = tl.exp(m - tl.max(m, axis=0))
    acc = tl.load(mo_ptr + (base + sp)[:, None] * D + d[None, :])
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(lsum * w, axis=0)
    tl.store(o_ptr + (row * H + head) * D + d, out.to(o_ptr.dtype.element_ty))


# Programs (rows x kv heads x splits) past which a span is not split further: two per
# multiprocessor of an H200 (132).
FULL_LAUNCH = 256


def attention_shape(span: int, programs: int = 1) -> tuple[int, int]:
    """(programs per row and kv head, positions per load) over a span, for a launch of `programs`
    (rows x kv heads) before any split. A decode step's attention is a few programs'
    latency-bound loops unless the span is split: on an H200 16 splits of a 512-position span ran
    in 4-5 us where one program took 11-14 (SmolLM2, 8B, one row), and 16 splits with
    128-position loads halved a 4096 span's time (bench/results/cuda_kernels_sweep.md). A launch
    that fills the GPU without splits is not split: 64 rows of the 8B shape (512 programs) over a
    256 span took 15-17 us unsplit against 30 with 8 splits and their combine
    (bench/results/gpu_b64/)."""
    splits = 1
    while splits < 16 and span // (splits * 2) >= 32 and programs * splits < FULL_LAUNCH:
        splits *= 2
    block_n = 32
    while block_n < 128 and span // splits >= block_n * 2:
        block_n *= 2
    return splits, block_n


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                    ctx: torch.Tensor, span: int, block_n: int = 0, splits: int = 0, warps: int = 4,
                    pdl: bool = False) -> torch.Tensor:
    """q [M, H, D]; tables [M, span / block_size] block ids; ctx [M] positions each row attends
    to (0: an idle row, which sees position 0 of its first block). Returns [M, H * D]."""
    M, H, D = q.shape
    kv_heads, bs = k_cache.shape[1], k_cache.shape[2]
    G = H // kv_heads
    auto_splits, auto_block = attention_shape(span, M * kv_heads)
    splits, block_n = splits or auto_splits, block_n or auto_block
    chunk = -(-span // (splits * block_n)) * block_n
    out = torch.empty(M, H * D, dtype=q.dtype, device=q.device)
    if splits > 1:
        mo = torch.empty(M * H * splits, D, dtype=torch.float32, device=q.device)
        ml = torch.empty(M * H * splits, 2, dtype=torch.float32, device=q.device)
    else:
        mo = ml = out
    _attention_kernel[(M, kv_heads, splits)](q, k_cache, v_cache, tables, tables.stride(0), ctx, out, mo, ml,
                                             1.0 / D ** 0.5, H=H, HKV=kv_heads, D=D, BS=bs,
                                             GP=max(16, triton.next_power_of_2(G)), CHUNK=chunk, BLOCK_N=block_n,
                                             SPLITS=splits, UPCAST=_UPCAST, PDL=pdl, num_warps=warps, launch_pdl=pdl)
    if splits > 1:
        _combine_kernel[(M, H)](mo, ml, out, H=H, D=D, SPLITS=splits, PDL=pdl, launch_pdl=pdl)
    return out
