"""Triton kernels for a GPU decode step of up to 16 rows: each decoder layer in five launches.

Why (the H200 profile in ../shared/profiles, and bench/results/): at batch 1 a SmolLM2-135M
step was ~540 kernels of 1-3.5 us each, so their count, not the weight reads, set the pace;
at 8B the weight GEMVs ran near the copy bandwidth but ~28 us a layer of small kernels (two
RMSNorms, RoPE, two KV scatters, two block gathers, softmax, split-K reductions) stood between
the step and the bandwidth limit. Here a layer is:

1. `qkv_rope`: RMSNorm of the residual row (every program recomputes it: a row is a few KB),
   the QKV GEMV (+ bias), Qwen3's q/k norm, RoPE, q out, k and v written into their blocks
2. `paged_attention`: one query row against its cached positions, read in place through the
   block table (no gather); long spans split over programs (until the launch fills the GPU),
   the last of them to finish combining the splits
3. `gemv_residual` (o_proj): GEMV + residual add
4. `gate_up_silu`: RMSNorm, the gate and up GEMVs, SiLU(g) * u
5. `gemv_residual` (down_proj)

Numerics follow the torch path: weights and activations in the model dtype, products summed
in float32, each projection's output rounded to the model dtype as a cuBLAS GEMM's would be,
the residual stream and the norms in float32. Attention scores stay float32 (flash attention
does the same); the torch path rounds them to the model dtype first, so the two agree within
the GPU tests' tolerance, not bit for bit.

Rows: 1 row is a multiply-and-sum on the CUDA cores; 2-16 rows pad to 16 for `tl.dot`.
Larger batches, and TP > 1 (an all-reduce sits between the GEMV and the residual add), keep
the cuBLAS path, where `rope_write` does kernel 1's work past its projection (RoPE, q out, the KV
write: one launch for torch's five). Padding to 32 or 64 rows lost to cuBLAS on an H200 (8B
shape, the best of 28 launch shapes each: QKV 66 us against 19 for cuBLAS and rope_write at 64
rows, gate/up 128 against 65; a 64-row step 11.1 ms against 6.1; bench/results/gpu_b64/): every
program re-reads and re-normalises the float32 activations of all its rows, which at 64 rows
outweighs the weight tile it reads. Without a GPU the kernels run in Triton's interpreter, which
is how the CPU tests check them.
"""

from __future__ import annotations

import dataclasses

# isort: off
from switchyard.engine.backends.cuda.triton_common import _UPCAST, _dot, _pdl_wait  # sets TRITON_INTERPRET first
import torch
import triton
import triton.language as tl
# isort: on

MAX_ROWS = 16


@triton.jit
def _row_scale(x_ptr, stride_x, M, K, eps, M_P: tl.constexpr, BLOCK: tl.constexpr):
    """rsqrt(mean(x^2) + eps) of each row of a float32 [M, K] block: [M_P]. BLOCK covers a whole
    row at batch 1 (one load: this runs before any weight is read, so its loads are latency)."""
    rows = tl.arange(0, M_P)
    ss = tl.zeros([M_P], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :],
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        ss += tl.sum(x * x, axis=1)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _weight_tile(w_ptr, stride_w, n_rows, k0, K, BLOCK_K: tl.constexpr):
    ks = k0 + tl.arange(0, BLOCK_K)
    return tl.load(w_ptr + n_rows[:, None] * stride_w + ks[None, :], mask=(ks < K)[None, :], other=0.0)


@triton.jit
def _matvec_step(acc, x_ptr, stride_x, ln_ptr, scale, w, k0, M, K, NORM: tl.constexpr, M_P: tl.constexpr,
                 BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    rows = tl.arange(0, M_P)
    ks = k0 + tl.arange(0, BLOCK_K)
    kmask = ks < K
    x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :], mask=(rows[:, None] < M) & kmask[None, :], other=0.0)
    if NORM:
        ln = tl.load(ln_ptr + ks, mask=kmask, other=0.0)
        x = (x * scale[:, None]) * ln[None, :]
    h = x.to(w.dtype)
    if M_P == 1:
        acc += h.to(tl.float32) * w.to(tl.float32)
    else:
        acc = _dot(h, tl.trans(w), acc, UPCAST)
    return acc


@triton.jit
def _matvec(x_ptr, stride_x, ln_ptr, eps, w_ptr, stride_w, n_rows, M, K,
            NORM: tl.constexpr, M_P: tl.constexpr, R: tl.constexpr, BLOCK_K: tl.constexpr,
            NORM_BLOCK: tl.constexpr, PREFETCH: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    """acc[m, r] = sum_k h[m, k] * W[n_rows[r], k] in float32, where h = x (model dtype) or, with
    NORM, RMSNorm(x) * ln rounded to the weights' dtype (x float32 [M, K]).
    The loop is bound by its loads' latency, so each iteration's weight tile (R x BLOCK_K) is what
    is in flight: the tiles are sized for that (tile_for), and at one row the partial products
    stay in a 2-D accumulator, summed once at the end. PREFETCH issues the first weight tile
    before the norm's pass over x, which otherwise leaves the program's first DRAM read waiting
    on an L2 round trip. With PDL the first weight tile is loaded before waiting for the kernel
    before: x is its output, the weights are not."""
    if M_P == 1:  # noqa: SIM108 (a constexpr branch: Triton compiles only the one taken)
        acc = tl.zeros([R, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([M_P, R], dtype=tl.float32)
    start = 0
    if PREFETCH:
        w0 = _weight_tile(w_ptr, stride_w, n_rows, 0, K, BLOCK_K)
    _pdl_wait(PDL)
    if NORM:  # noqa: SIM108
        scale = _row_scale(x_ptr, stride_x, M, K, eps, M_P, NORM_BLOCK)
    else:
        scale = eps
    if PREFETCH:
        acc = _matvec_step(acc, x_ptr, stride_x, ln_ptr, scale, w0, 0, M, K, NORM, M_P, BLOCK_K, UPCAST)
        start = BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        w = _weight_tile(w_ptr, stride_w, n_rows, k0, K, BLOCK_K)
        acc = _matvec_step(acc, x_ptr, stride_x, ln_ptr, scale, w, k0, M, K, NORM, M_P, BLOCK_K, UPCAST)
    if M_P == 1:
        acc = tl.sum(acc, axis=1)[None, :]
    return acc


@triton.jit
def _matvec_pair(x_ptr, stride_x, ln_ptr, eps, w_ptr, stride_w, n1, second, M, K,
                 NORM: tl.constexpr, M_P: tl.constexpr, R: tl.constexpr, BLOCK_K: tl.constexpr,
                 NORM_BLOCK: tl.constexpr, PREFETCH: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    """_matvec over rows n1 and n1 + second in one loop (twice the bytes in flight, one pass over
    x): the rows interleaved, the result split back into (acc over n1, acc over n1 + second)."""
    both = tl.reshape(n1[:, None] + tl.arange(0, 2)[None, :] * second, [2 * R])
    acc = _matvec(x_ptr, stride_x, ln_ptr, eps, w_ptr, stride_w, both, M, K, NORM, M_P, 2 * R, BLOCK_K,
                  NORM_BLOCK, PREFETCH, UPCAST, PDL)
    return tl.split(tl.reshape(acc, [M_P, R, 2]))


@triton.jit
def _rope_angles(rows, r, pos_ptr, cos_ptr, sin_ptr, M, D: tl.constexpr):
    """The rows' positions and their RoPE angles at columns r (cos, sin [rows, R])."""
    pos = tl.load(pos_ptr + rows, mask=rows < M, other=0)
    return pos, tl.load(cos_ptr + pos[:, None] * D + r[None, :]), tl.load(sin_ptr + pos[:, None] * D + r[None, :])


@triton.jit
def _rope_inputs(rows, r, pos_ptr, cos_ptr, sin_ptr, blk_ptr, off_ptr, M, D: tl.constexpr):
    """What _rope_store takes besides the projection: the rows' RoPE angles at columns r (cos,
    sin [rows, R]) and their new keys' cache slots (block, offset [rows]). The step's inputs,
    written before its first layer: a PDL kernel loads them before its wait."""
    live = rows < M
    _, c, s = _rope_angles(rows, r, pos_ptr, cos_ptr, sin_ptr, M, D)
    return c, s, tl.load(blk_ptr + rows, mask=live, other=0), tl.load(off_ptr + rows, mask=live, other=0)


@triton.jit
def _rope_inputs_tabled(rows, r, pos_ptr, cos_ptr, sin_ptr, tab_ptr, tab_stride, M, D: tl.constexpr, BS: tl.constexpr):
    """_rope_inputs with each row's cache slot read from its block table [M, tab_stride]: block
    tables[m, pos // BS], offset pos % BS. A one-row decode step's three torch kernels (the
    division, the gather, the remainder) a step less: 6 us of SmolLM2's 0.42 ms batch-1 step on an
    H100 (bench/results/gpu_step_cuts)."""
    pos, c, s = _rope_angles(rows, r, pos_ptr, cos_ptr, sin_ptr, M, D)
    blk = tl.load(tab_ptr + rows.to(tl.int64) * tab_stride + pos // BS, mask=rows < M, other=0)
    return c, s, blk, pos % BS


@triton.jit
def _rope_store(y1, y2, rows, r, head, qkn_ptr, c, s, blk, off, q_ptr, kc_ptr, vc_ptr, M, qk_eps, H: tl.constexpr,
                HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, QK_NORM: tl.constexpr):
    """Columns r and r + D/2 of `head` of the QKV projection (y1, y2: float32 [rows, R], already
    rounded to the model dtype) for the given rows: q and k (normed,) rotated by (c, s); q stored
    in q_ptr [M, H, D], k and v written into the cache blocks at (blk, off) of each row
    (_rope_inputs)."""
    HALF: tl.constexpr = D // 2
    odt = q_ptr.dtype.element_ty
    live = rows < M
    if head < H + HKV:  # q or k: (norm,) rotate
        if QK_NORM:  # the whole head is in this program (R == D / 2)
            nw = qkn_ptr + (head >= H).to(tl.int32) * D  # q_norm's weights, then k_norm's
            inv = 1.0 / tl.sqrt((tl.sum(y1 * y1, axis=1) + tl.sum(y2 * y2, axis=1)) / D + qk_eps)
            y1 = (y1 * inv[:, None]) * tl.load(nw + r)[None, :]
            y2 = (y2 * inv[:, None]) * tl.load(nw + HALF + r)[None, :]
        o1 = y1 * c - y2 * s
        o2 = y2 * c + y1 * s
    else:
        o1 = y1
        o2 = y2
    if head < H:
        q_rows = q_ptr + rows[:, None] * (H * D) + head * D
        tl.store(q_rows + r[None, :], o1.to(odt), mask=live[:, None])
        tl.store(q_rows + HALF + r[None, :], o2.to(odt), mask=live[:, None])
    else:
        is_v = head >= H + HKV
        is_k = head < H + HKV
        kv = head - H - is_v.to(tl.int32) * HKV
        at = ((blk * HKV + kv) * BS + off)[:, None] * D + r[None, :]
        tl.store(kc_ptr + at, o1.to(odt), mask=live[:, None] & is_k)
        tl.store(kc_ptr + at + HALF, o2.to(odt), mask=live[:, None] & is_k)
        tl.store(vc_ptr + at, o1.to(odt), mask=live[:, None] & is_v)
        tl.store(vc_ptr + at + HALF, o2.to(odt), mask=live[:, None] & is_v)


@triton.jit
def _qkv_rope_kernel(x_ptr, stride_x, ln_ptr, w_ptr, b_ptr, qkn_ptr, cos_ptr, sin_ptr, pos_ptr,
                     blk_ptr, off_ptr, q_ptr, kc_ptr, vc_ptr, M, K, eps, qk_eps, tab_stride,
                     H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                     R: tl.constexpr, M_P: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr,
                     PREFETCH: tl.constexpr, HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, UPCAST: tl.constexpr,
                     TABLES: tl.constexpr, PDL: tl.constexpr):
    # Program (head, chunk): rows [c*R, c*R + R) of the head's first half and the same rows of
    # its second half, so that RoPE's pairs (i, i + D/2) meet in one program.
    head = tl.program_id(0)
    chunk = tl.program_id(1)
    HALF: tl.constexpr = D // 2
    r = chunk * R + tl.arange(0, R)
    n1 = head * D + r
    n2 = n1 + HALF
    rows = tl.arange(0, M_P)
    if TABLES:  # blk_ptr: the rows' block tables
        c, s, blk, off = _rope_inputs_tabled(rows, r, pos_ptr, cos_ptr, sin_ptr, blk_ptr, tab_stride, M, D, BS)
    else:
        c, s, blk, off = _rope_inputs(rows, r, pos_ptr, cos_ptr, sin_ptr, blk_ptr, off_ptr, M, D)
    a1, a2 = _matvec_pair(x_ptr, stride_x, ln_ptr, eps, w_ptr, K, n1, HALF, M, K, True, M_P, R, BLOCK_K,
                          NORM_BLOCK, PREFETCH, UPCAST, PDL)
    odt = q_ptr.dtype.element_ty
    if HAS_BIAS:
        a1 += tl.load(b_ptr + n1).to(tl.float32)[None, :]
        a2 += tl.load(b_ptr + n2).to(tl.float32)[None, :]
    y1 = a1.to(odt).to(tl.float32)  # the projection's output in the model dtype, as cuBLAS gives it
    y2 = a2.to(odt).to(tl.float32)
    _rope_store(y1, y2, rows, r, head, qkn_ptr, c, s, blk, off, q_ptr, kc_ptr, vc_ptr, M, qk_eps, H, HKV, D, BS,
                QK_NORM)


@triton.jit
def _rope_write_kernel(qkv_ptr, qkn_ptr, cos_ptr, sin_ptr, pos_ptr, blk_ptr, off_ptr, q_ptr, kc_ptr, vc_ptr,
                       M, qk_eps, H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                       BLOCK_M: tl.constexpr, QK_NORM: tl.constexpr, PDL: tl.constexpr):
    # Program (head, row block): a whole head of BLOCK_M rows of a QKV projection's output
    # [M, (H + 2 HKV) D], both halves, so that RoPE's pairs and Qwen3's q/k norm meet in it.
    head = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    HALF: tl.constexpr = D // 2
    r = tl.arange(0, HALF)
    c, s, blk, off = _rope_inputs(rows, r, pos_ptr, cos_ptr, sin_ptr, blk_ptr, off_ptr, M, D)
    _pdl_wait(PDL)
    at = qkv_ptr + rows[:, None] * ((H + 2 * HKV) * D) + head * D + r[None, :]
    live = (rows < M)[:, None]
    y1 = tl.load(at, mask=live, other=0.0).to(tl.float32)
    y2 = tl.load(at + HALF, mask=live, other=0.0).to(tl.float32)
    _rope_store(y1, y2, rows, r, head, qkn_ptr, c, s, blk, off, q_ptr, kc_ptr, vc_ptr, M, qk_eps, H, HKV, D, BS,
                QK_NORM)


@triton.jit
def _gemv_residual_kernel(a_ptr, w_ptr, x_ptr, out_ptr, M, N, K,
                          R: tl.constexpr, M_P: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
                          EARLY_X: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    # out[m, n] = x[m, n] + round(W[n] . a[m]): the projection rounded to the model dtype (as the
    # cuBLAS path's output is), added to the float32 residual stream.
    n = tl.program_id(0) * R + tl.arange(0, R)
    nmask = n < N
    nr = tl.where(nmask, n, 0)
    rows = tl.arange(0, M_P)
    mask = (rows[:, None] < M) & nmask[None, :]
    at = rows[:, None] * N + n[None, :]
    if EARLY_X:  # before _matvec's wait: x is no output of the kernel just before
        x = tl.load(x_ptr + at, mask=mask, other=0.0)
    acc = _matvec(a_ptr, K, a_ptr, 0.0, w_ptr, K, nr, M, K, False, M_P, R, BLOCK_K, 1, PREFETCH, UPCAST, PDL)
    if not EARLY_X:
        x = tl.load(x_ptr + at, mask=mask, other=0.0)
    y = acc.to(w_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + at, x + y, mask=mask)


@triton.jit
def _gate_up_silu_kernel(x_ptr, ln_ptr, w_ptr, out_ptr, M, INTER, K, eps,
                         R: tl.constexpr, M_P: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr,
                         PREFETCH: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    # out[m, j] = SiLU(g) * u with g, u = rows j and INTER + j of the fused gate_up weight applied
    # to RMSNorm(x[m]), each rounded to the model dtype first (the torch path's gate_up output).
    j = tl.program_id(0) * R + tl.arange(0, R)
    jmask = j < INTER
    jr = tl.where(jmask, j, 0)
    g, u = _matvec_pair(x_ptr, K, ln_ptr, eps, w_ptr, K, jr, INTER, M, K, True, M_P, R, BLOCK_K, NORM_BLOCK,
                        PREFETCH, UPCAST, PDL)
    odt = out_ptr.dtype.element_ty
    g = g.to(odt).to(tl.float32)
    u = u.to(odt).to(tl.float32)
    a = g / (1.0 + tl.exp(-g)) * u
    rows = tl.arange(0, M_P)
    tl.store(out_ptr + rows[:, None] * INTER + j[None, :], a.to(odt), mask=(rows[:, None] < M) & jmask[None, :])


# -- launchers --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Tile:
    """One GEMV kernel's launch shape: outputs per program, reduction elements per load, warps,
    pipeline stages (used by the tl.dot path), and whether the first weight tile is loaded ahead
    of the norm's pass over x."""

    rows: int
    block_k: int
    warps: int = 4
    stages: int = 3
    prefetch: bool = False


def _rows_pad(M: int) -> int:
    assert 1 <= M <= MAX_ROWS, f"fused decode takes 1..{MAX_ROWS} rows, got {M}"
    return 1 if M == 1 else 16


def _norm_block(M_P: int, K: int) -> int:
    return min(triton.next_power_of_2(K), 8192 if M_P == 1 else 256)


def tile_for(kind: str, M_P: int, n: int, k: int, elem: int = 2) -> Tile:
    """The launch shape of a GEMV kernel ('qkv' and 'gate_up' read two row sets at once, 'gemv'
    one) over an n x k weight of `elem`-byte elements at M_P padded rows. From bench/cuda_kernels_sweep.py on an
    H200 (bench/results/cuda_kernels_sweep.md): at one row, many small programs (4 outputs each)
    with 1K-element loads ran the 8B projections at 3.2-3.9 TB/s where 16 outputs and 256-element
    loads ran them at 1.7-2.5; a reduction of up to 2K elements in one load; the first tile loaded
    ahead of the norm (1-8% faster, every kernel). At 16 rows (tl.dot), 32 outputs and 256-element
    loads, 4 stages deep."""
    pair = kind in ("qkv", "gate_up")
    if M_P == 1:
        if k <= 2048:  # SmolLM2's o (k 576) and down (1,536): 4 outputs, 8 warps past 1K (gpu_head/ call 6)
            if kind == "gemv":
                return Tile(4, triton.next_power_of_2(k), 8 if k > 1024 else 4, prefetch=True)
            return Tile(4 if kind == "gate_up" else 2, triton.next_power_of_2(k), 4, prefetch=True)
        return Tile(8, 256, 4, prefetch=True) if kind == "gate_up" else Tile(4, 512 if pair else 1024, 4, prefetch=True)
    if kind == "gate_up":
        t = Tile(64, 128, 4, 3) if k >= 4096 else Tile(16, 256, 4, 3)
    else:
        t = Tile(32, 256, 4, 4)
    # The tl.dot pipeline's stages must fit in shared memory: float32 weights take twice
    # bfloat16's (4 stages of the 16-row tiles would ask ~260 KB of an H200's 227).
    while t.stages * (M_P + (2 if pair else 1) * t.rows) * t.block_k * elem > 160 * 1024:
        t = dataclasses.replace(t, stages=t.stages - 1) if t.stages > 2 else dataclasses.replace(t, block_k=t.block_k // 2)
    return t


def qkv_rope(x: torch.Tensor, ln: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
             qk_norm: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
             pos: torch.Tensor, blocks: torch.Tensor | None, offs: torch.Tensor | None, k_cache: torch.Tensor,
             v_cache: torch.Tensor, heads: int, kv_heads: int, eps: float, tile: Tile | None = None,
             pdl: bool = False, tables: torch.Tensor | None = None) -> torch.Tensor:
    """x float32 [M, hidden] -> q [M, heads, D] (model dtype); k and v of each row written into
    k_cache/v_cache [blocks, kv_heads, block_size, D] at (blocks[m], offs[m]), or, with blocks
    and offs None, at (tables[m, pos[m] // block_size], pos[m] % block_size) of the rows' block
    tables (int64 [M, nb], rows contiguous). qk_norm: Qwen3's q_norm and k_norm weights,
    concatenated (float32 [2 D]), or None. pdl: launched with programmatic dependent launch
    (triton_common.pdl_supported), as every launcher here may be."""
    M, K = x.shape
    tabled = blocks is None
    if tabled:
        assert tables is not None and offs is None and tables.stride(1) == 1, "the rows' cache slots or their tables"
        blocks, offs = tables, tables  # offs: not read
    D, bs = k_cache.shape[-1], k_cache.shape[-2]
    M_P = _rows_pad(M)
    t = tile or tile_for("qkv", M_P, w.shape[0] // 2, K, w.element_size())
    # Qwen3's q/k norm needs the whole head in one program; else up to the tile's rows, at most D/2
    R = D // 2 if qk_norm is not None else min(t.rows, D // 2)
    q = torch.empty(M, heads, D, dtype=w.dtype, device=x.device)
    grid = (heads + 2 * kv_heads, (D // 2) // R)
    _qkv_rope_kernel[grid](x, x.stride(0), ln, w, bias if bias is not None else w,
                           qk_norm if qk_norm is not None else ln, cos, sin, pos, blocks, offs,
                           q, k_cache, v_cache, M, K, eps, eps, blocks.stride(0) if tabled else 0,
                           H=heads, HKV=kv_heads, D=D, BS=bs, R=R, M_P=M_P,
                           BLOCK_K=t.block_k, NORM_BLOCK=_norm_block(M_P, K), PREFETCH=t.prefetch,
                           HAS_BIAS=bias is not None, QK_NORM=qk_norm is not None, UPCAST=_UPCAST,
                           TABLES=tabled, PDL=pdl,
                           num_warps=t.warps, num_stages=t.stages, launch_pdl=pdl)
    return q


def rope_write(qkv: torch.Tensor, qk_norm: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
               pos: torch.Tensor, blocks: torch.Tensor, offs: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, heads: int, kv_heads: int, eps: float, block_m: int = 16,
               pdl: bool = False) -> torch.Tensor:
    """qkv_rope past its projection, for a step of any row count: a QKV projection's output
    qkv [M, (heads + 2 kv_heads) D] (model dtype, bias added) -> q [M, heads, D]; k and v written
    into the cache as qkv_rope writes them. One launch where the torch path takes several
    (RoPE, casts, the rows' cache indices, two index copies)."""
    M = qkv.shape[0]
    D, bs = k_cache.shape[-1], k_cache.shape[-2]
    q = torch.empty(M, heads, D, dtype=qkv.dtype, device=qkv.device)
    _rope_write_kernel[(heads + 2 * kv_heads, triton.cdiv(M, block_m))](
        qkv, qk_norm if qk_norm is not None else cos, cos, sin, pos, blocks, offs, q, k_cache, v_cache, M, eps,
        H=heads, HKV=kv_heads, D=D, BS=bs, BLOCK_M=block_m, QK_NORM=qk_norm is not None, PDL=pdl, launch_pdl=pdl)
    return q


def gemv_residual(a: torch.Tensor, w: torch.Tensor, x: torch.Tensor, tile: Tile | None = None,
                  pdl: bool = False, x_ready: bool = False) -> torch.Tensor:
    """x + (a @ w.T) rounded to w's dtype; a [M, K] model dtype, w [N, K], x float32 [M, N].
    x_ready: x is no output of the kernel launched just before (a decode layer's o_proj adds the
    layer's input, its down_proj o_proj's output, two kernels back), so that a PDL launch loads it
    before its wait, beside its weights, and not as one more round trip after the product (on an
    H100, SmolLM2 at one row: see bench/results/gpu_attention_early/)."""
    M, K = a.shape
    N = w.shape[0]
    out = torch.empty(M, N, dtype=torch.float32, device=a.device)
    M_P = _rows_pad(M)
    t = tile or tile_for("gemv", M_P, N, K, w.element_size())
    _gemv_residual_kernel[(triton.cdiv(N, t.rows),)](a, w, x, out, M, N, K, R=t.rows, M_P=M_P, BLOCK_K=t.block_k,
                                                     PREFETCH=t.prefetch, EARLY_X=x_ready, UPCAST=_UPCAST, PDL=pdl,
                                                     num_warps=t.warps,
                                                     num_stages=t.stages, launch_pdl=pdl)
    return out


def gate_up_silu(x: torch.Tensor, ln: torch.Tensor, w: torch.Tensor, eps: float,
                 tile: Tile | None = None, pdl: bool = False) -> torch.Tensor:
    """SiLU(gate) * up of RMSNorm(x) * ln; x float32 [M, hidden], w [2 I, hidden] -> [M, I]."""
    M, K = x.shape
    inter = w.shape[0] // 2
    out = torch.empty(M, inter, dtype=w.dtype, device=x.device)
    M_P = _rows_pad(M)
    t = tile or tile_for("gate_up", M_P, inter, K, w.element_size())
    _gate_up_silu_kernel[(triton.cdiv(inter, t.rows),)](x, ln, w, out, M, inter, K, eps, R=t.rows, M_P=M_P,
                                                        BLOCK_K=t.block_k, NORM_BLOCK=_norm_block(M_P, K),
                                                        PREFETCH=t.prefetch, UPCAST=_UPCAST, PDL=pdl, num_warps=t.warps,
                                                        num_stages=t.stages, launch_pdl=pdl)
    return out


# -- prefill's elementwise parts ---------------------------------------------------------------
# torch.compile's dynamic-shape kernels for these ran at 0.5-1.1 TB/s on an 8k-token prefill of an
# 8B model (25 ms of its 240); rows of contiguous loads run them near the copy bandwidth.


# Kernel 2 of the five, in its own file.
from switchyard.engine.backends.cuda.paged_attention import attention_shape, paged_attention  # noqa: E402

__all__ = ["MAX_ROWS", "Tile", "attention_shape", "gate_up_silu", "gemv_residual", "paged_attention", "qkv_rope",
           "rope_write", "tile_for"]
