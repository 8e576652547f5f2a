"""A decode step's LM head as the served path runs it against one Triton kernel, on the GPU's clock.

Served (model/decoder.py's logits, the cuda backend): the final RMSNorm (prefill_kernels.rms_norm,
float32 out, which the refinement also reads), its copy to bf16, cuBLAS's GEMV against the bf16
head. In a SmolLM2 step at batch 1 on an H100 the GEMV took 21.5-22.4 us (2.5-2.6 TB/s of a 56.6 MB
head) where the layers' Triton GEMVs run at 3+ TB/s (bench/results/gpu_attention_early/, call 8).
The candidate: the norm, its rounding and the GEMV in one kernel (kernels._matvec with NORM: every
program normalises the row, a few KB, then its head rows), the float32 norm kept for the refinement.
Not served: measure it first (each in a CUDA graph of 20 launches, cuda_kernels_sweep.time_us):

  python bench/head_gemv.py --shapes 49152x576,128256x4096 --rows 1,16
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

# isort: off
from switchyard.engine.backends.cuda.triton_common import _UPCAST, tl, triton  # sets TRITON_INTERPRET first
from switchyard.engine.backends.cuda import kernels as ck, prefill_kernels as pk
from cuda_kernels_sweep import time_us
# isort: on


@triton.jit
def _norm_gemv_kernel(x_ptr, ln_ptr, w_ptr, out_ptr, M, N, K, eps, R: tl.constexpr, M_P: tl.constexpr,
                      BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr, PREFETCH: tl.constexpr, UPCAST: tl.constexpr):
    # out[m, n] = round(W[n] . round(RMSNorm(x[m]) * ln)): the served head's bf16 logits.
    n = tl.program_id(0) * R + tl.arange(0, R)
    nmask = n < N
    acc = ck._matvec(x_ptr, K, ln_ptr, eps, w_ptr, K, tl.where(nmask, n, 0), M, K, True, M_P, R, BLOCK_K, NORM_BLOCK,
                     PREFETCH, UPCAST, False)
    rows = tl.arange(0, M_P)
    tl.store(out_ptr + rows[:, None] * N + n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & nmask[None, :])


def norm_gemv(x: torch.Tensor, ln: torch.Tensor, w: torch.Tensor, eps: float, tile: ck.Tile | None = None) -> torch.Tensor:
    """x float32 [M, K] (M <= 16), ln [K], w [N, K] -> [M, N] in w's dtype: F.linear(RMSNorm(x) * ln as
    w's dtype, w), rounded as cuBLAS's output is. tile: the layers' GEMV tile unless given."""
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty(M, N, dtype=w.dtype, device=x.device)
    M_P = ck._rows_pad(M)
    t = tile or ck.tile_for("gemv", M_P, N, K, w.element_size())
    _norm_gemv_kernel[(triton.cdiv(N, t.rows),)](x, ln, w, out, M, N, K, eps, R=t.rows, M_P=M_P, BLOCK_K=t.block_k,
                                                 NORM_BLOCK=ck._norm_block(M_P, K), PREFETCH=t.prefetch,
                                                 UPCAST=_UPCAST, num_warps=t.warps, num_stages=t.stages)
    return out


def served(x: torch.Tensor, ln: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(the float32 norm, the bf16 logits) as the served step computes them."""
    h = pk.rms_norm(x, ln, eps, torch.float32)
    return h, F.linear(h.to(w.dtype), w)


def fused(x: torch.Tensor, ln: torch.Tensor, w: torch.Tensor, eps: float,
          tile: ck.Tile | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return pk.rms_norm(x, ln, eps, torch.float32), norm_gemv(x, ln, w, eps, tile)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="49152x576,128256x4096", help="vocabulary x hidden")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--tiles", default="", help="one kernel's tiles besides the layers' (outputs x reduction "
                    "elements x warps [x stages], comma-separated: 16x1024x4,32x256x8)")
    a = ap.parse_args()
    tiles: list[ck.Tile | None] = [None]
    for spec in filter(None, a.tiles.split(",")):
        r, bk, wp, *st = (int(v) for v in spec.split("x"))
        tiles.append(ck.Tile(r, bk, wp, *(st or [3]), prefetch=True))
    print(f"# The LM head's norm + GEMV, {torch.cuda.get_device_name()}: us a step in a CUDA graph\n")
    print("| vocabulary x hidden | rows | served (norm, cast, cuBLAS) | one kernel (+ the norm for the refinement) "
          "| served / fused | fused head TB/s | max logit diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for shape in a.shapes.split(","):
        V, K = (int(s) for s in shape.split("x"))
        w = (torch.randn(V, K, device="cuda") * 0.02).to(torch.bfloat16)
        ln = 1 + 0.1 * torch.randn(K, device="cuda")
        for M in (int(s) for s in a.rows.split(",")):
            x = torch.randn(M, K, device="cuda") * 3
            ref = served(x, ln, w, 1e-5)[1]
            us_a = time_us(lambda i, x=x, ln=ln, w=w: served(x, ln, w, 1e-5), 20)
            for t in tiles if M == 1 else [None]:  # the tiles are one row's (16 rows: tl.dot's)
                got = fused(x, ln, w, 1e-5, t)[1]
                err = (got.float() - ref.float()).abs().max().item()
                us_b = time_us(lambda i, x=x, ln=ln, w=w, t=t: fused(x, ln, w, 1e-5, t), 20)
                name = "layers'" if t is None else f"{t.rows}x{t.block_k}x{t.warps}x{t.stages}"
                print(f"| {V:,} x {K:,} | {M} | {us_a:.2f} | {us_b:.2f} ({name}) | {us_a / us_b:.2f}x | "
                      f"{w.numel() * 2 / us_b / 1e6:.2f} | {err:.3g} |", flush=True)


if __name__ == "__main__":
    main()
