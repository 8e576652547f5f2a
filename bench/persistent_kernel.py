"""A batch-1 decode step's layers in one persistent launch, for a narrow model (SmolLM2's shape):
one program per multiprocessor, every layer's five stages (kernels.py) run in turn, and a
grid-wide barrier between two stages where the five launches have a kernel boundary.

A bench variant, not served (`cuda-persistent`, engine_cuda_variants.py): on an H200 it runs a
SmolLM2 step's 30 layers in 510-536 us; a step with it kept the GPU busy 0.574-0.600 ms against
0.473-0.478 ms for the five PDL kernels a layer, in each of six calls that ran both
(results/gpu_persistent/). The barriers are not what costs: 0.93 us each alone (grid_barrier.py).
Program 0's clock (persistent_stages.py) puts a layer at ~18 us: QKV 2.7, attention 4.4, o-proj
3.3, gate/up 4.8, down 2.7, each a barrier plus the stage's own latency, no shorter than the
standalone kernels' (3.0, 5.6, 2.1, 3.6, 2.1 without PDL), which PDL already overlaps. It lives
with the benches, as what lost on the H200 does, not in the engine.

Why: at batch 1 a SmolLM2-135M step was ~150 dependent kernels of 2.5-3.5 us each even with
programmatic dependent launch (bench/results/gpu_pdl/): the wait's release, an L2 read of the
activations, a block reduction, a store and the grid's completion, on every boundary. Here a
boundary is a counter that every program adds one to (release) and spins on (acquire) until
all have, and each program loads its weight tile of the next stage *before* it spins, so the
weights stream in while the slowest program of the stage before finishes.

A stage, per program (its unit: the rows it owns; the launch sizes rows so that no program owns
two units of a stage):
1. RMSNorm of the residual, its QKV rows (both halves of RoPE's pairs), RoPE, q out, k and v into
   the layer's cache blocks (kernels._rope_store, shared with the five-kernel path);
2. attention of one (kv head, span split) against the cache (paged_attention._attend), its
   partial sums out;
3. o-proj: each program combines every split of every head (a few KB from L2) and computes its
   rows of o, added to the residual in place;
4. RMSNorm, its gate and up rows, SiLU(g) * u out;
5. down-proj, its rows added to the residual in place.

A program owns the same residual rows in stages 3 and 5, so it reads them before its spin there
(its own writes, or the embedding's): what the five-kernel path read after its wait.

Data another program wrote during this launch is loaded with '.cg' (from L2): a program's L1 is
not coherent with the others', and nothing between two stages invalidates it. The counter and
an exit counter are the caller's (zeros); the last program to exit sets both back to zero.

Without a GPU (Triton's interpreter runs programs one after another, so a spin would never
end) the launcher runs one stage of one layer a launch, the kernel boundary standing in for the
barrier: the same code on the same data, which is how the CPU tests check it.

Where it applies (`supported`): one rank, one row, dense 16/32-bit projections without QKV bias
or q/k norm, hidden < kernels' WIDE_HIDDEN; the stages' units within the launch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

# isort: off
from switchyard.engine.backends.cuda.triton_common import _UPCAST  # sets TRITON_INTERPRET first
from triton.language.extra.cuda import globaltimer
import torch
import triton
import triton.language as tl
# isort: on

from switchyard.engine.backends.base import LayerWeights, ModelDims
from switchyard.engine.backends.cuda.kernels import _rope_inputs, _rope_store
from switchyard.engine.backends.cuda.paged_attention import _attend, _first_blocks, _kv_tile

STAGES = 5
MAX_SPLITS = 8  # attention's span splits at most (the o stage combines them in registers)
BLOCK_N = 64  # attention positions per load
TILE = 4096  # weight elements a load, per warp of the program: at SmolLM2's widths every stage's tile is its whole slice
# Polls a program may spend waiting at barriers in one launch (~1 us each: seconds) before it gives
# the launch up as wrong rather than hang (_wait).
SPIN_BUDGET = 1 << 22


@triton.jit
def _arrive(bar_ptr, SYNC: tl.constexpr):
    """Count this program at the barrier after its stores (every thread's, the CTA barrier
    first; release: they are visible to whoever acquires the count)."""
    if SYNC:
        tl.debug_barrier()
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait(bar_ptr, target, spins, SYNC: tl.constexpr):
    """Spin until `target` programs have arrived (acquire: their stores are visible after), or
    until `spins` polls are spent: a launch whose programs are not all resident (something else
    holding multiprocessors) would wait forever; a budget spent marks the launch failed and lets
    it finish (wrong, not hung). Returns the polls left, this program's budget from now. Polled
    with acquire atomics: on an H200 a barrier of 132 programs took 0.93 us so, 1.35 us polled
    with acquire loads (bench/grid_barrier.py, bench/results/gpu_persistent/)."""
    if SYNC:
        if target > 0:
            n = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
            while (n < target) & (spins > 0):
                spins -= 1
                n = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
    return spins


@triton.jit
def _tile(w_ptr, rows, k0, K: tl.constexpr, BK: tl.constexpr):
    ks = k0 + tl.arange(0, BK)
    return tl.load(w_ptr + rows[:, None] * K + ks[None, :], mask=(ks < K)[None, :], other=0.0)


@triton.jit
def _inv_rms(x_ptr, eps, K: tl.constexpr, KP: tl.constexpr):
    ks = tl.arange(0, KP)
    x = tl.load(x_ptr + ks, mask=ks < K, other=0.0, cache_modifier=".cg")
    return 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)


@triton.jit
def _gemv_step(w, x_ptr, ln_ptr, scale, k0, K: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr):
    ks = k0 + tl.arange(0, BK)
    x = tl.load(x_ptr + ks, mask=ks < K, other=0.0, cache_modifier=".cg")
    if NORM:
        x = (x * scale) * tl.load(ln_ptr + ks, mask=ks < K, other=0.0)
    return tl.sum(w.to(tl.float32) * x.to(w.dtype).to(tl.float32)[None, :], axis=1)


@triton.jit
def _gemv(w0, w_ptr, rows, x_ptr, ln_ptr, scale, R: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
          NORM: tl.constexpr):
    """sum_k W[rows, k] h[k] in float32 ([R]), h = x (the weights' dtype) or, with NORM,
    RMSNorm(x) * ln rounded to it (x float32); w0 is the first tile, loaded before the barrier.
    Each tile summed on its own (no [R, BK] accumulator held across tiles: registers)."""
    acc = _gemv_step(w0, x_ptr, ln_ptr, scale, 0, K, BK, NORM)
    for k0 in range(BK, K, BK):
        acc += _gemv_step(_tile(w_ptr, rows, k0, K, BK), x_ptr, ln_ptr, scale, k0, K, BK, NORM)
    return acc


@triton.jit
def _qkv_stage(u, x_ptr, ln_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, blk_ptr, off_ptr, q_ptr, kc_ptr, vc_ptr, eps,
               bar_ptr, target, spins, HID: tl.constexpr, HP: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr,
               D: tl.constexpr, BS: tl.constexpr, RQ: tl.constexpr, BKQ: tl.constexpr, SYNC: tl.constexpr):
    HALF: tl.constexpr = D // 2
    CH: tl.constexpr = HALF // RQ
    UNITS: tl.constexpr = (H + 2 * HKV) * CH
    live = u < UNITS
    uu = tl.where(live, u, 0)
    head = uu // CH
    r = (uu % CH) * RQ + tl.arange(0, RQ)
    n1 = head * D + r
    both = tl.reshape(n1[:, None] + tl.arange(0, 2)[None, :] * HALF, [2 * RQ])  # RoPE's pairs, interleaved
    w0 = _tile(w_ptr, both, 0, HID, BKQ)
    c, s, blk, off = _rope_inputs(tl.arange(0, 1), r, pos_ptr, cos_ptr, sin_ptr, blk_ptr, off_ptr, 1, D)
    spins = _wait(bar_ptr, target, spins, SYNC)
    if live:
        acc = _gemv(w0, w_ptr, both, x_ptr, ln_ptr, _inv_rms(x_ptr, eps, HID, HP), 2 * RQ, HID, BKQ, True)
        a1, a2 = tl.split(tl.reshape(acc, [RQ, 2]))
        odt = q_ptr.dtype.element_ty
        y1 = a1.to(odt).to(tl.float32)[None, :]  # the projection's output in the model dtype
        y2 = a2.to(odt).to(tl.float32)[None, :]
        _rope_store(y1, y2, tl.arange(0, 1), r, head, ln_ptr, c, s, blk, off, q_ptr, kc_ptr, vc_ptr, 1, eps, H, HKV, D,
                    BS, False)
    _arrive(bar_ptr, SYNC)
    return spins


@triton.jit
def _attention_stage(u, q_ptr, kc_ptr, vc_ptr, table_ptr, ctx_ptr, mo_ptr, ml_ptr, chunk, sm_scale,
                     bar_ptr, target, spins, H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                     GP: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
                     SYNC: tl.constexpr):
    live = u < HKV * SPLITS
    kvh = tl.where(live, u, 0) // SPLITS
    split = tl.where(live, u, 0) % SPLITS
    start = split * chunk
    end = tl.minimum(start + chunk, tl.maximum(tl.load(ctx_ptr), 1))  # an idle row sees position 0
    blk0 = _first_blocks(table_ptr, start, end, BS, BLOCK_N)  # the step's inputs: before the spin
    spins = _wait(bar_ptr, target, spins, SYNC)
    if live:
        G: tl.constexpr = H // HKV
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        heads = kvh * G + g
        q = tl.load(q_ptr + heads[:, None] * D + d[None, :], mask=(g < G)[:, None], other=0.0, cache_modifier=".cg")
        k0, v0 = _kv_tile(kc_ptr, vc_ptr, blk0, start + tl.arange(0, BLOCK_N), end, kvh, HKV, D, BS, ".cg")
        acc, m_i, l_i = _attend(q, kc_ptr, vc_ptr, table_ptr, kvh, start, end, k0, v0, sm_scale, HKV, D, BS, GP,
                                BLOCK_N, UPCAST, ".cg")
        part = heads * SPLITS + split
        tl.store(mo_ptr + part[:, None] * D + d[None, :], acc, mask=(g < G)[:, None])
        tl.store(ml_ptr + part * 2, m_i, mask=g < G)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=g < G)
    _arrive(bar_ptr, SYNC)
    return spins


@triton.jit
def _attention_out(mo_ptr, ml_ptr, h0, HG: tl.constexpr, H: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    """The attention output of heads [h0, h0 + HG) ([HG * D], float32): each head's splits'
    partial sums rescaled to their common maximum and divided by the total."""
    hs = h0 + tl.arange(0, HG)
    live = hs < H
    d = tl.arange(0, D)
    top = tl.full([HG], -1.0e30, dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        top = tl.maximum(top, tl.load(ml_ptr + (hs * SPLITS + s) * 2, mask=live, other=-1.0e30, cache_modifier=".cg"))
    total = tl.zeros([HG], dtype=tl.float32)
    acc = tl.zeros([HG, D], dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        part = hs * SPLITS + s
        w = tl.exp(tl.load(ml_ptr + part * 2, mask=live, other=-1.0e30, cache_modifier=".cg") - top)
        total += w * tl.load(ml_ptr + part * 2 + 1, mask=live, other=0.0, cache_modifier=".cg")
        acc += w[:, None] * tl.load(mo_ptr + part[:, None] * D + d[None, :], mask=live[:, None], other=0.0,
                                    cache_modifier=".cg")
    return tl.reshape(acc / tl.maximum(total, 1.0e-30)[:, None], [HG * D])


@triton.jit
def _o_stage(u, w_ptr, mo_ptr, ml_ptr, x_ptr, bar_ptr, target, spins, HID: tl.constexpr, H: tl.constexpr,
             D: tl.constexpr, RO: tl.constexpr, HG: tl.constexpr, SPLITS: tl.constexpr, SYNC: tl.constexpr):
    # The projection's input in chunks of HG heads (HG * D elements): the attention output of
    # those heads, combined from its splits here rather than by a last program of the stage before
    K: tl.constexpr = H * D
    BK: tl.constexpr = HG * D
    live = u < HID // RO
    n = tl.where(live, u, 0) * RO + tl.arange(0, RO)
    w0 = _tile(w_ptr, n, 0, K, BK)
    xr = tl.load(x_ptr + n, cache_modifier=".cg")  # this program's own rows: the down stage's (RD == RO) or the embedding
    spins = _wait(bar_ptr, target, spins, SYNC)
    if live:
        a = _attention_out(mo_ptr, ml_ptr, 0, HG, H, D, SPLITS)
        acc = tl.sum(w0.to(tl.float32) * a.to(w0.dtype).to(tl.float32)[None, :], axis=1)  # a as stored in bf16
        for h0 in range(HG, H, HG):
            w = _tile(w_ptr, n, h0 * D, K, BK)
            a = _attention_out(mo_ptr, ml_ptr, h0, HG, H, D, SPLITS)
            acc += tl.sum(w.to(tl.float32) * a.to(w.dtype).to(tl.float32)[None, :], axis=1)
        y = acc.to(w_ptr.dtype.element_ty).to(tl.float32)
        tl.store(x_ptr + n, xr + y)
    _arrive(bar_ptr, SYNC)
    return spins


@triton.jit
def _gate_up_stage(u, x_ptr, ln_ptr, w_ptr, h_ptr, eps, bar_ptr, target, spins, HID: tl.constexpr, HP: tl.constexpr,
                   INTER: tl.constexpr, RG: tl.constexpr, BKG: tl.constexpr, SYNC: tl.constexpr):
    live = u < INTER // RG
    j = tl.where(live, u, 0) * RG + tl.arange(0, RG)
    both = tl.reshape(j[:, None] + tl.arange(0, 2)[None, :] * INTER, [2 * RG])
    w0 = _tile(w_ptr, both, 0, HID, BKG)
    spins = _wait(bar_ptr, target, spins, SYNC)
    if live:
        acc = _gemv(w0, w_ptr, both, x_ptr, ln_ptr, _inv_rms(x_ptr, eps, HID, HP), 2 * RG, HID, BKG, True)
        g, up = tl.split(tl.reshape(acc, [RG, 2]))
        odt = h_ptr.dtype.element_ty
        g = g.to(odt).to(tl.float32)
        up = up.to(odt).to(tl.float32)
        tl.store(h_ptr + j, (g / (1.0 + tl.exp(-g)) * up).to(odt))
    _arrive(bar_ptr, SYNC)
    return spins


@triton.jit
def _down_stage(u, w_ptr, h_ptr, x_ptr, bar_ptr, target, spins, HID: tl.constexpr, INTER: tl.constexpr, RD: tl.constexpr,
                BKD: tl.constexpr, SYNC: tl.constexpr):
    live = u < HID // RD
    n = tl.where(live, u, 0) * RD + tl.arange(0, RD)
    w0 = _tile(w_ptr, n, 0, INTER, BKD)
    xr = tl.load(x_ptr + n, cache_modifier=".cg")  # this program's own rows, from the o stage (RO == RD)
    spins = _wait(bar_ptr, target, spins, SYNC)
    if live:
        y = _gemv(w0, w_ptr, n, h_ptr, h_ptr, 1.0, RD, INTER, BKD, False).to(w_ptr.dtype.element_ty).to(tl.float32)
        tl.store(x_ptr + n, xr + y)
    _arrive(bar_ptr, SYNC)
    return spins


@triton.jit
def _stamp(times_ptr, u, at, TIMED: tl.constexpr):
    """With TIMED (persistent_stages.py): program 0's clock (ns) as it leaves a stage, i.e.
    its spin for the stage before plus its own work in this one."""
    if TIMED:  # noqa: SIM102 (a constexpr branch, then a runtime one)
        if u == 0:
            tl.store(times_ptr + at, globaltimer())


@triton.jit
def _layers_kernel(x_ptr, offs_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, ln1_ptr, ln2_ptr, kc_ptr, vc_ptr,
                   cos_ptr, sin_ptr, pos_ptr, blk_ptr, off_ptr, table_ptr, ctx_ptr, q_ptr, mo_ptr, ml_ptr, h_ptr,
                   bar_ptr, times_ptr, chunk, eps, sm_scale, layer_lo, layer_hi, only, budget,
                   HID: tl.constexpr, HP: tl.constexpr, INTER: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr,
                   D: tl.constexpr, BS: tl.constexpr, GP: tl.constexpr, RQ: tl.constexpr, BKQ: tl.constexpr,
                   RO: tl.constexpr, HG: tl.constexpr, RG: tl.constexpr, BKG: tl.constexpr, RD: tl.constexpr,
                   BKD: tl.constexpr, NPROG: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                   UPCAST: tl.constexpr, SYNC: tl.constexpr, TIMED: tl.constexpr = False):
    # offs_ptr [layers, 7]: each layer's qkv, o, gate_up, down, ln1, ln2 and cache as element offsets
    # from layer 0's (pointer arithmetic, which the interpreter follows too; int64). `only` >= 0: that stage
    # alone (the interpreter's launches); else every stage of layers [layer_lo, layer_hi).
    u = tl.program_id(0)
    spins = budget
    _stamp(times_ptr, u, layer_hi * 5, TIMED)  # the start, after the last stage's stamp
    for li in range(layer_lo, layer_hi):
        offs = offs_ptr + li * 7
        kc = kc_ptr + tl.load(offs + 6)
        vc = vc_ptr + tl.load(offs + 6)
        g0 = li * 5
        if (only < 0) | (only == 0):
            spins = _qkv_stage(u, x_ptr, ln1_ptr + tl.load(offs + 4), wqkv_ptr + tl.load(offs), cos_ptr, sin_ptr,
                               pos_ptr, blk_ptr, off_ptr, q_ptr, kc, vc, eps, bar_ptr, g0 * NPROG, spins, HID, HP, H,
                               HKV, D, BS, RQ, BKQ, SYNC)
        _stamp(times_ptr, u, li * 5 + 0, TIMED)
        if (only < 0) | (only == 1):
            spins = _attention_stage(u, q_ptr, kc, vc, table_ptr, ctx_ptr, mo_ptr, ml_ptr, chunk, sm_scale, bar_ptr,
                                     (g0 + 1) * NPROG, spins, H, HKV, D, BS, GP, SPLITS, BLOCK_N, UPCAST, SYNC)
        _stamp(times_ptr, u, li * 5 + 1, TIMED)
        if (only < 0) | (only == 2):
            spins = _o_stage(u, wo_ptr + tl.load(offs + 1), mo_ptr, ml_ptr, x_ptr, bar_ptr, (g0 + 2) * NPROG, spins, HID,
                             H, D, RO, HG, SPLITS, SYNC)
        _stamp(times_ptr, u, li * 5 + 2, TIMED)
        if (only < 0) | (only == 3):
            spins = _gate_up_stage(u, x_ptr, ln2_ptr + tl.load(offs + 5), wgu_ptr + tl.load(offs + 2), h_ptr, eps,
                                   bar_ptr, (g0 + 3) * NPROG, spins, HID, HP, INTER, RG, BKG, SYNC)
        _stamp(times_ptr, u, li * 5 + 3, TIMED)
        if (only < 0) | (only == 4):
            spins = _down_stage(u, wd_ptr + tl.load(offs + 3), h_ptr, x_ptr, bar_ptr, (g0 + 4) * NPROG, spins, HID,
                                INTER, RD, BKD, SYNC)
        _stamp(times_ptr, u, li * 5 + 4, TIMED)
    if SYNC:  # the last program out sets the counters back to zero: every other one is past its last spin
        if spins == 0:
            tl.atomic_xchg(bar_ptr + 2, 1, sem="relaxed", scope="gpu")  # a barrier given up on: the step is wrong
        if tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu") == NPROG - 1:
            tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(bar_ptr + 1, 0, sem="relaxed", scope="gpu")


# -- the launcher ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shape:
    """The launch: programs, warps, and each stage's rows a program and weight elements a load."""

    programs: int
    warps: int
    rq: int
    bkq: int
    ro: int
    hg: int
    rg: int
    bkg: int
    rd: int
    bkd: int

    @staticmethod
    def of(dims: ModelDims, layers: Sequence[LayerWeights], programs: int, warps: int = 8, tile: int = TILE) -> Shape:
        return shape_for(dims, layers[0].gate_up.w.shape[0] // 2, programs, warps, tile)


def _rows(n: int, programs: int) -> int:
    return triton.next_power_of_2(-(-n // programs))


def _bk(rows: int, k: int, elems: int) -> int:
    return min(triton.next_power_of_2(k), max(16, elems // rows))


def shape_for(dims: ModelDims, inter: int, programs: int, warps: int = 8, tile: int = TILE) -> Shape:
    """Rows per program: the fewest (a power of two) that leave no program two units of a stage;
    loads of TILE elements a warp (8 warps: SmolLM2's stages compile without spills for sm90)."""
    half = dims.head_dim // 2
    rq = min(half, _rows((dims.heads + 2 * dims.kv_heads) * half, programs))
    # ro == rd: a program adds to the same residual rows in both stages, so it reads them before its spin
    ro = rd = _rows(dims.hidden, programs)
    rg = _rows(inter, programs)
    e = tile * warps
    hg = min(triton.next_power_of_2(dims.heads), max(1, _bk(ro, dims.q_size, e) // dims.head_dim))
    return Shape(programs, warps, rq, _bk(2 * rq, dims.hidden, e), ro, hg, rg, _bk(2 * rg, dims.hidden, e), rd,
                 _bk(rd, inter, e))


def programs_for(device: torch.device) -> int:
    """One program per multiprocessor (all resident at once: a spin needs every program running);
    the interpreter's launches take any count."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 16


def supported(dims: ModelDims, layers: Sequence[LayerWeights], wide: int) -> str:
    """'' where the persistent kernel runs this model's batch-1 steps; else why not."""
    if dims.tp != 1:
        return "tensor parallel"
    if dims.hidden >= wide:
        return f"hidden {dims.hidden} >= {wide}: its GEMVs stream as well in five kernels a layer"
    l0 = layers[0]
    for name in ("qkv", "o", "gate_up", "down"):
        w = getattr(getattr(l0, name), "w", None)
        if w is None or w.element_size() not in (2, 4):
            return f"{name} is not a dense 16/32-bit projection"
    if getattr(l0.qkv, "b", None) is not None or l0.qk_norm is not None:
        return "QKV bias or q/k norm"
    if dims.head_dim & (dims.head_dim - 1) or dims.heads % dims.kv_heads:
        return "head geometry"
    return ""


def cache_layer_stride(dims: ModelDims) -> int:
    """Elements between two layers' caches, as the decoder lays them out: [layers, num_blocks + the
    spare, kv_heads, block_size, head_dim] (run_layers checks it)."""
    return (dims.num_blocks + 1) * dims.kv_heads * dims.block_size * dims.head_dim


def layer_offsets(layers: Sequence[LayerWeights], kv_stride: int) -> torch.Tensor:
    """[layers, 7] int64: each layer's qkv, o, gate_up, down, ln1 and ln2, in elements from layer 0's,
    and its cache's."""
    def tensors(layer: LayerWeights) -> list[torch.Tensor]:
        return [layer.qkv.w, layer.o.w, layer.gate_up.w, layer.down.w, layer.ln1, layer.ln2]

    base = tensors(layers[0])
    rows = []
    for layer in layers:
        row = []
        for t, t0 in zip(tensors(layer), base, strict=True):
            gap = t.data_ptr() - t0.data_ptr()
            assert gap % t.element_size() == 0 and t.is_contiguous() and t.shape == t0.shape
            row.append(gap // t.element_size())
        rows.append(row + [len(rows) * kv_stride])
    return torch.tensor(rows, dtype=torch.int64, device=base[0].device)


def run_layers(x: torch.Tensor, layers: Sequence[LayerWeights], offsets: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, dims: ModelDims, pos: torch.Tensor, blocks: torch.Tensor, offs: torch.Tensor,
               tables: torch.Tensor, ctx: torch.Tensor, span: int, counters: torch.Tensor, shape: Shape,
               grid_sync: bool, times: torch.Tensor | None = None) -> torch.Tensor:
    """Every layer of a one-row decode step: x float32 [1, hidden] (the residual, updated in place
    and returned); k_cache/v_cache [layers, blocks, kv_heads, block_size, D]; counters int32 [3]
    zeros, left at zero. grid_sync: one launch with barriers (a GPU), else a launch a stage.
    times: int64 [layers * 5] on a GPU, where program 0 writes its clock as it leaves each stage
    (persistent_stages.py), else None."""
    from switchyard.engine.backends.cuda.paged_attention import attention_shape

    d, l0 = dims, layers[0]
    H, D = d.heads, d.head_dim
    assert k_cache.stride(0) == cache_layer_stride(d) and v_cache.stride() == k_cache.stride(), "cache layout"
    inter = l0.gate_up.w.shape[0] // 2
    splits = min(attention_shape(span, d.kv_heads)[0], MAX_SPLITS)
    while d.kv_heads * splits > shape.programs:
        splits //= 2
    chunk = -(-span // (splits * BLOCK_N)) * BLOCK_N
    dev, dt = x.device, l0.o.w.dtype
    q = torch.empty(H * D, dtype=dt, device=dev)
    mo = torch.empty(H * splits * D, dtype=torch.float32, device=dev)
    ml = torch.empty(H * splits * 2, dtype=torch.float32, device=dev)
    h = torch.empty(inter, dtype=dt, device=dev)
    s = shape
    args = (x, offsets, l0.qkv.w, l0.o.w, l0.gate_up.w, l0.down.w, l0.ln1, l0.ln2, k_cache, v_cache, d.cos, d.sin, pos, blocks, offs, tables, ctx, q, mo, ml, h, counters, times if times is not None else counters, chunk,
            d.eps, 1.0 / D ** 0.5)
    consts = dict(HID=d.hidden, HP=triton.next_power_of_2(d.hidden), INTER=inter, H=H, HKV=d.kv_heads, D=D,
                  BS=d.block_size, GP=max(16, triton.next_power_of_2(H // d.kv_heads)), RQ=s.rq, BKQ=s.bkq, RO=s.ro,
                  HG=s.hg, RG=s.rg, BKG=s.bkg, RD=s.rd, BKD=s.bkd, NPROG=s.programs, SPLITS=splits,
                  BLOCK_N=BLOCK_N, UPCAST=_UPCAST, num_warps=s.warps)
    n = len(layers)
    if grid_sync:
        _layers_kernel[(s.programs,)](*args, 0, n, -1, SPIN_BUDGET, SYNC=True, TIMED=times is not None, **consts)
    else:
        for li in range(n):
            for stage in range(STAGES):
                _layers_kernel[(s.programs,)](*args, li, li + 1, stage, 0, SYNC=False, **consts)
    return x
