"""Kernel 2 of a GPU decode layer (kernels.py), and the attention of every decode step of the
cuda backend: one query row per program against its cached positions, read in place through
the block table (no gather); long spans split over programs until the launch fills the GPU,
and the last program of a (row, kv head) to finish combines the splits' partial sums (a counter
per pair, left at zero for the next launch): one launch where a combine kernel made two. On an
H200 the fused kernel ran 5.6 us where the two ran 2.7 + 1.4 us and a launch between them, and a
SmolLM2 step at batch 1 went from 1,728 to 1,771 tok/s with it (bench/results/gpu_pdl/, calls 1 and
3: within the spread between calls, so a small gain at most). In a small launch each program
loads its first tile of keys and values before its PDL wait, all but the newest position, which
the kernel before writes (attention_shape, EARLY_TILE)."""

from __future__ import annotations

# isort: off
from switchyard.engine.backends.cuda.triton_common import _UPCAST, _dot, _pdl_wait  # sets TRITON_INTERPRET first
import torch
import triton
import triton.language as tl
# isort: on


@triton.jit
def _attention_kernel(q_ptr, kc_ptr, vc_ptr, tables_ptr, stride_t, ctx_ptr, o_ptr, mo_ptr, ml_ptr, cnt_ptr, sm_scale,
                      H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                      GP: tl.constexpr, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                      EARLY: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    # Program (row, kv head, split): the kv head's G query heads (padded to GP rows for tl.dot)
    # over positions [split * CHUNK, (split + 1) * CHUNK) of the row's context.
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    n_ctx = tl.maximum(tl.load(ctx_ptr + row), 1)  # an idle slot sees position 0 of the spare block
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, n_ctx)
    blk0 = _first_blocks(tables_ptr + row * stride_t, start, end, BS, BLOCK_N)  # step inputs: before the wait
    t0 = start + tl.arange(0, BLOCK_N)
    if EARLY:
        # The first tile's keys and values too, but for the newest position's: a decode step
        # writes only position n_ctx - 1 of each row (the kernel before does), every earlier one
        # was written by an earlier step, which finished before the kernel before passed its wait.
        k0, v0 = _kv_tile(kc_ptr, vc_ptr, blk0, t0, tl.minimum(end, n_ctx - 1), kvh, HKV, D, BS, "")
        _pdl_wait(PDL)  # q and this step's keys and values are the kernel before's
        k0, v0 = _newest_kv(k0, v0, kc_ptr, vc_ptr, blk0, t0, n_ctx - 1, kvh, HKV, D, BS)
    else:
        _pdl_wait(PDL)
        k0, v0 = _kv_tile(kc_ptr, vc_ptr, blk0, t0, end, kvh, HKV, D, BS, "")
    G: tl.constexpr = H // HKV
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    heads = kvh * G + g
    q = tl.load(q_ptr + row * (H * D) + heads[:, None] * D + d[None, :], mask=(g < G)[:, None], other=0.0)
    acc, m_i, l_i = _attend(q, kc_ptr, vc_ptr, tables_ptr + row * stride_t, kvh, start, end, k0, v0, sm_scale, HKV, D,
                            BS, GP, BLOCK_N, UPCAST, "")
    live = (g < G)[:, None]
    if SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(o_ptr + row * (H * D) + heads[:, None] * D + d[None, :], out.to(o_ptr.dtype.element_ty), mask=live)
    else:
        base = (row * H + heads) * SPLITS
        part = base + split
        tl.store(mo_ptr + part[:, None] * D + d[None, :], acc, mask=live)
        tl.store(ml_ptr + part * 2, m_i, mask=g < G)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=g < G)
        # Every thread's stores before the count (the barrier), the count with release and
        # acquire semantics: the program that counts last sees every split's partial sums.
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + row * HKV + kvh, 1, sem="acq_rel", scope="gpu")
        if done == SPLITS - 1:
            _combine(mo_ptr, ml_ptr, o_ptr, row, heads, g < G, d, base, H, D, SPLITS, GP)
            tl.atomic_xchg(cnt_ptr + row * HKV + kvh, 0, sem="relaxed", scope="gpu")


@triton.jit
def _first_blocks(table_ptr, start, end, BS: tl.constexpr, BLOCK_N: tl.constexpr):
    """The block ids of positions [start, start + BLOCK_N) below end (0 past it): a tile's. A
    caller loads the first tile's before its wait (the table is the step's input, not a kernel's
    output)."""
    t = start + tl.arange(0, BLOCK_N)
    return tl.load(table_ptr + t // BS, mask=t < end, other=0)


@triton.jit
def _kv_tile(kc_ptr, vc_ptr, blk, t, end, kvh, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
             CACHE: tl.constexpr):
    """Keys and values [len(t), D] of positions t below end (zeros past it), read through their
    blocks blk (_first_blocks)."""
    d = tl.arange(0, D)
    at = ((blk * HKV + kvh) * BS + t % BS)[:, None] * D + d[None, :]
    valid = (t < end)[:, None]
    k = tl.load(kc_ptr + at, mask=valid, other=0.0, cache_modifier=CACHE)
    v = tl.load(vc_ptr + at, mask=valid, other=0.0, cache_modifier=CACHE)
    return k, v


@triton.jit
def _newest_kv(k, v, kc_ptr, vc_ptr, blk, t, newest, kvh, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr):
    """The tile (k, v) of positions t with position `newest` read now, after the wait: the one
    this step wrote."""
    d = tl.arange(0, D)
    at = ((blk * HKV + kvh) * BS + t % BS)[:, None] * D + d[None, :]
    here = (t == newest)[:, None]
    k = tl.where(here, tl.load(kc_ptr + at, mask=here, other=0.0), k)
    v = tl.where(here, tl.load(vc_ptr + at, mask=here, other=0.0), v)
    return k, v


@triton.jit
def _attend_tile(q, k, v, t, end, sm_scale, acc, m_i, l_i, UPCAST: tl.constexpr):
    """One tile of the online softmax: keys and values k, v [BLOCK_N, D] of positions t, those
    at end or past it masked out."""
    s = _dot(q, tl.trans(k), tl.zeros([q.shape[0], k.shape[0]], dtype=tl.float32), UPCAST) * sm_scale
    s = tl.where((t < end)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
    return acc, m_new, l_i


@triton.jit
def _attend(q, kc_ptr, vc_ptr, table_ptr, kvh, start, end, k0, v0, sm_scale, HKV: tl.constexpr, D: tl.constexpr,
            BS: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, CACHE: tl.constexpr):
    """Online softmax of q [GP, D] (one kv head's query heads) over the row's positions
    [start, end), read through its block table (k0, v0: the first tile's keys and values, which
    a caller loads itself, _kv_tile): (acc [GP, D], max [GP], sum [GP]), float32, the sum of
    exp(s - max) * v not yet divided. CACHE: the cache modifier of the later tiles' loads ('.cg'
    where this launch wrote some of them itself, the persistent kernel)."""
    m_i = tl.full([GP], -1.0e30, dtype=tl.float32)  # finite: a fully masked tile keeps alpha at 1, not NaN
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, D], dtype=tl.float32)
    acc, m_i, l_i = _attend_tile(q, k0, v0, start + tl.arange(0, BLOCK_N), end, sm_scale, acc, m_i, l_i, UPCAST)
    for t0 in range(start + BLOCK_N, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        k, v = _kv_tile(kc_ptr, vc_ptr, _first_blocks(table_ptr, t0, end, BS, BLOCK_N), t, end, kvh, HKV, D, BS, CACHE)
        acc, m_i, l_i = _attend_tile(q, k, v, t, end, sm_scale, acc, m_i, l_i, UPCAST)
    return acc, m_i, l_i


@triton.jit
def _combine(mo_ptr, ml_ptr, o_ptr, row, heads, live, d, base, H: tl.constexpr, D: tl.constexpr,
             SPLITS: tl.constexpr, GP: tl.constexpr):
    """The splits' partial sums of `heads` [GP] (at base + split) rescaled to their common
    maximum, written out. Loaded from L2 (.cg): other programs wrote them, and this one's L1 may
    hold an older launch's lines at the same addresses."""
    sp = tl.arange(0, SPLITS)
    at = (base[:, None] + sp[None, :]) * 2
    m = tl.load(ml_ptr + at, mask=live[:, None], other=0.0, cache_modifier=".cg")  # [GP, SPLITS]
    lsum = tl.load(ml_ptr + at + 1, mask=live[:, None], other=1.0, cache_modifier=".cg")
    top = tl.max(m, axis=1)
    total = tl.sum(lsum * tl.exp(m - top[:, None]), axis=1)
    acc = tl.zeros([GP, D], dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        w = tl.exp(tl.load(ml_ptr + (base + s) * 2, mask=live, other=0.0, cache_modifier=".cg") - top)
        acc += tl.load(mo_ptr + (base + s)[:, None] * D + d[None, :], mask=live[:, None], other=0.0,
                       cache_modifier=".cg") * w[:, None]
    out = acc / total[:, None]
    tl.store(o_ptr + row * (H * D) + heads[:, None] * D + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=live[:, None])


# The largest first tile (positions x head dim) loaded before the PDL wait, in a launch of at most
# FULL_LAUNCH programs. Held in registers across the wait, where a launch that fills the GPU also
# holds its multiprocessors from the kernel before: on an H100 (bench/results/gpu_attention_early/,
# call 5) the 8B shape's 64 rows (512 programs of 128 x 128) took 58 us a layer early against 25
# late, SmolLM2's (384 of 128 x 64) 11.9 against 8.2; at one row (24 programs of 32 x 64) 6.3 against 6.8.
EARLY_TILE = 8192

# Programs (rows x kv heads x splits) past which a span is not split further: two per
# multiprocessor of an H200 (132).
FULL_LAUNCH = 256


def attention_shape(span: int, programs: int = 1) -> tuple[int, int]:
    """(programs per row and kv head, positions per load) over a span, for a launch of `programs`
    (rows x kv heads) before any split. A decode step's attention is a few programs'
    latency-bound loops unless the span is split: on an H200 16 splits of a 512-position span ran
    in 4-5 us where one program took 11-14 (SmolLM2, 8B, one row), and 16 splits with
    128-position loads halved a 4096 span's time (bench/results/cuda_kernels_sweep.md). A split
    holds 64 positions or more: its first tile is loaded before the kernel's PDL wait, so a
    64-position tile costs no more than a 32-position one, and fewer splits leave less to
    combine (SmolLM2, one row, 256 span on an H100: 4 splits of 64 took 4.9 us against 6.3 for 8
    of 32, bench/results/gpu_attention_early/). A launch that fills the GPU without splits is not
    split: 64 rows of the 8B shape (512 programs) over a 256 span took 15-17 us unsplit against 30
    with 8 splits and their combine (bench/results/gpu_b64/)."""
    splits = 1
    while splits < 16 and span // (splits * 2) >= 64 and programs * splits < FULL_LAUNCH:
        splits *= 2
    block_n = 32
    while block_n < 128 and span // splits >= block_n * 2:
        block_n *= 2
    return splits, block_n


def _early(programs: int, tile: int) -> bool:
    return programs <= FULL_LAUNCH and tile <= EARLY_TILE


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                    ctx: torch.Tensor, span: int, block_n: int = 0, splits: int = 0, warps: int = 4,
                    pdl: bool = False, counters: torch.Tensor | None = None, early: bool | None = None) -> torch.Tensor:
    """q [M, H, D]; tables [M, span / block_size] block ids; ctx [M] positions each row attends
    to (0: an idle row, which sees position 0 of its first block). Returns [M, H * D].
    counters: int32 zeros, at least M * kv heads, that a split launch counts its programs in and
    leaves at zero (a caller's buffer spares a launch of torch.zeros each call). early: the first
    tile loaded before the PDL wait (None: in a launch of at most FULL_LAUNCH programs whose
    tile holds at most EARLY_TILE keys' elements)."""
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
        if counters is None or counters.numel() < M * kv_heads:
            counters = torch.zeros(M * kv_heads, dtype=torch.int32, device=q.device)
    else:
        mo = ml = counters = out
    _attention_kernel[(M, kv_heads, splits)](q, k_cache, v_cache, tables, tables.stride(0), ctx, out, mo, ml, counters,
                                             1.0 / D ** 0.5, H=H, HKV=kv_heads, D=D, BS=bs,
                                             GP=max(16, triton.next_power_of_2(G)), CHUNK=chunk, BLOCK_N=block_n,
                                             SPLITS=splits, EARLY=_early(M * kv_heads * splits, block_n * D) if early is None else early,
                                             UPCAST=_UPCAST, PDL=pdl, num_warps=warps, launch_pdl=pdl)
    return out
