"""Launch shapes of the fused decode GEMV kernels (engine/cuda_kernels.tile_for), swept on a GPU.

  python bench/cuda_kernels_sweep.py --out DIR [--shapes smollm2-135m,llama-8b] [--rows 1,16]

Each kernel (qkv_rope, gemv_residual on o_proj and down_proj, gate_up_silu) runs on one layer's
shapes with random bf16 weights, over as many weight copies as it takes to pass 200 MB (a layer
of SmolLM2 fits in the H200's L2, a real step's layers do not), launched back to back in one
CUDA graph: the time a launch takes inside a decode step's graph. For each launch shape tried:
microseconds a launch and the weight bytes read per second, against the default tile_for picks
and against what the cuBLAS path runs in its place on the same rows (the projection by cuBLAS,
with kernels.rope_write after the QKV one and the SiLU kernel after gate/up; its RMSNorm and
residual add not counted). Writes sweep.json and sweep.md to DIR; the fastest shape per kernel
is what tile_for should return.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from switchyard.engine.backends.cuda import kernels as ck
from switchyard.engine.backends.cuda import prefill_kernels as pk
from switchyard.engine.model.random_weights import SHAPES

L2_DEFEAT_BYTES = 200e6


def time_us(launch: Callable[[int], None], copies: int, reps: int = 10) -> float:
    """Microseconds per launch: `copies` launches (one per weight copy) captured in a graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(copies):  # compile and warm outside the capture
            launch(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(copies):
            launch(i)
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) * 1000 / (reps * copies))
    return best


def near(kind: str, M_P: int, n: int, k: int, head_dim: int) -> list[ck.Tile]:
    """tile_for's pick and its neighbours (half and twice the rows or the load), each with and
    without the first tile's prefetch."""
    base = ck.tile_for(kind, M_P, n, k)
    out = []
    for dr, dk, pf in itertools.product((0.5, 1, 2), (0.5, 1, 2), (False, True)):
        r, bk = int(base.rows * dr), int(base.block_k * dk)
        if r < 1 or bk < 32 or (M_P > 1 and r < 16) or (kind == "qkv" and r > head_dim // 2):
            continue
        if dr != 1 and dk != 1:  # one change at a time
            continue
        out.append(dataclasses.replace(base, rows=r, block_k=bk, prefetch=pf))
    return out


def candidates(kind: str, M_P: int, n: int, k: int, head_dim: int) -> list[ck.Tile]:
    pair = 2 if kind in ("qkv", "gate_up") else 1
    out = []
    if M_P == 1:
        for r, bk, w in itertools.product((1, 2, 4, 8, 16), (256, 512, 1024, 2048), (1, 2, 4, 8)):
            elems = pair * r * bk
            if bk > 2 * triton_pow2(k) or not 512 <= elems <= 32768 or (kind == "qkv" and r > head_dim // 2):
                continue
            if elems // (32 * w) > 128 or elems // (32 * w) < 4:  # registers a thread holds
                continue
            out.append(ck.Tile(r, bk, w))
    else:
        for r, bk, w, st in itertools.product((16, 32, 64), (64, 128, 256), (4, 8), (3, 4)):
            if kind == "qkv" and r > head_dim // 2:
                continue
            if pair * r * bk > 16384 or (w == 8 and pair * r * bk < 4096):
                continue
            out.append(ck.Tile(r, bk, w, st))
    # likeliest first (tiles of ~16K elements at one row, ~4K at 16), so a budget cut loses the rest
    aim = 4096 if M_P == 1 else 4096
    return sorted(out, key=lambda t: abs(math.log2(pair * t.rows * t.block_k / aim)) + 0.1 * (t.warps == 8))


def triton_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def kernels(name: str, M: int, dev: torch.device) -> dict[str, tuple[int, int, Callable[[int, ck.Tile | None], None],
                                                                   int, int, Callable[[int], None]]]:
    """kind label -> (n, k, launch(copy, tile), copies, weight bytes a launch, the cuBLAS path's
    launches in its place(copy))."""
    c = SHAPES[name]
    H, Hkv, D, hid, inter = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size, c.intermediate_size
    dt = torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def weights(n: int, k: int) -> list[torch.Tensor]:
        copies = max(1, min(64, int(L2_DEFEAT_BYTES // (n * k * 2)) + 1))
        return [torch.randn(n, k, generator=g, device=dev, dtype=dt) * 0.02 for _ in range(copies)]

    x = torch.randn(M, hid, generator=g, device=dev)
    ln = torch.ones(hid, device=dev)
    bs, nblocks, max_len = 16, 64, 1024
    kc = torch.zeros(nblocks, Hkv, bs, D, device=dev, dtype=dt)
    vc = torch.zeros_like(kc)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    f = torch.outer(torch.arange(max_len, device=dev, dtype=torch.float32), inv)
    cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()
    pos = torch.arange(M, device=dev) + 100
    blocks = torch.arange(M, device=dev)
    offs = pos % bs
    wq, wo = weights((H + 2 * Hkv) * D, hid), weights(hid, H * D)
    wgu, wd = weights(2 * inter, hid), weights(hid, inter)
    a_o = torch.randn(M, H * D, generator=g, device=dev, dtype=dt)
    a_d = torch.randn(M, inter, generator=g, device=dev, dtype=dt)
    h = x.to(dt)
    return {
        "qkv": ((H + 2 * Hkv) * D // 2, hid, lambda i, t: ck.qkv_rope(x, ln, wq[i], None, None, cos, sin, pos, blocks,
                                                                       offs, kc, vc, H, Hkv, 1e-5, t),
                len(wq), wq[0].numel() * 2,
                lambda i: ck.rope_write(F.linear(h, wq[i]), None, cos, sin, pos, blocks, offs, kc, vc, H, Hkv, 1e-5)),
        "o_proj": (hid, H * D, lambda i, t: ck.gemv_residual(a_o, wo[i], x, t), len(wo), wo[0].numel() * 2,
                   lambda i: F.linear(a_o, wo[i])),
        "gate_up": (inter, hid, lambda i, t: ck.gate_up_silu(x, ln, wgu[i], 1e-5, t), len(wgu), wgu[0].numel() * 2,
                    lambda i: pk.silu_mul(F.linear(h, wgu[i]))),
        "down_proj": (hid, inter, lambda i, t: ck.gemv_residual(a_d, wd[i], x, t), len(wd), wd[0].numel() * 2,
                      lambda i: F.linear(a_d, wd[i])),
    }


def attention_sweep(name: str, M: int, span: int, dev: torch.device) -> list[dict[str, Any]]:
    """paged_attention at one span: microseconds a launch for block sizes, splits and warps."""
    c = SHAPES[name]
    bs = 16
    nb = span // bs
    copies = 16  # distinct layers' caches, as in a step
    kc = [torch.randn(M * nb + 1, c.num_kv_heads, bs, c.head_dim, device=dev, dtype=torch.bfloat16)
          for _ in range(copies)]
    q = torch.randn(M, c.num_heads, c.head_dim, device=dev, dtype=torch.bfloat16)
    tables = torch.arange(M * nb, device=dev).view(M, nb)
    ctx = torch.full((M,), span, device=dev)
    out = []
    for bn, sp, w in itertools.product((32, 64, 128), (1, 2, 4, 8, 16), (2, 4)):
        if sp * bn > span:
            continue
        try:
            us = time_us(lambda i, bn=bn, sp=sp, w=w: ck.paged_attention(q, kc[i], kc[i], tables, ctx, span, bn, sp, w),
                         copies)
        except Exception as e:
            print(f"  attention {name} {bn} {sp} {w}: {type(e).__name__}: {str(e)[:100]}", flush=True)
            continue
        out.append({"block_n": bn, "splits": sp, "warps": w, "us": us})
    return sorted(out, key=lambda r: r["us"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2-135m,llama-8b")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--budget-s", type=float, default=300, help="shared evenly by the kernels swept")
    ap.add_argument("--out", default="/tmp")
    ap.add_argument("--kernels", default="qkv,o_proj,gate_up,down_proj")
    ap.add_argument("--near", action="store_true", help="only tile_for's pick and its neighbours, prefetch or not")
    ap.add_argument("--attention-spans", default="", help="also sweep paged_attention at these spans (M = --rows)")
    a = ap.parse_args()
    dev = torch.device("cuda")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    per_kernel = a.budget_s / (len(a.kernels.split(",")) * len(a.shapes.split(",")) * len(a.rows.split(",")))
    results: list[dict[str, Any]] = []
    md = ["| shape | rows | kernel | default tile | us | GB/s | best tile | us | GB/s | cuBLAS path us | GB/s |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, M in itertools.product(a.shapes.split(","), (int(r) for r in a.rows.split(","))):
        M_P = ck._rows_pad(M)
        for span in (int(x) for x in a.attention_spans.split(",") if x):
            att = attention_sweep(name, M, span, dev)
            sp, bn = ck.attention_shape(span, M * SHAPES[name].num_kv_heads)
            default = next((r for r in att if r["block_n"] == bn and r["splits"] == sp and r["warps"] == 4), None)
            results.append({"shape": name, "rows": M, "kernel": f"attention@{span}", "default": default,
                            "top5": att[:5]})
            print(f"attention {name} M={M} span {span}: default {default}, best {att[:3]}", flush=True)
            (out / "sweep.json").write_text(json.dumps(results, indent=1))
        for kind, (n, k, launch, copies, nbytes, cublas) in kernels(name, M, dev).items():
            if kind not in a.kernels.split(","):
                continue
            tk = {"o_proj": "gemv", "down_proj": "gemv"}.get(kind, kind)
            default = ck.tile_for(tk, M_P, n, k)
            d_us = time_us(lambda i, f=launch: f(i, None), copies)
            c_us = time_us(cublas, copies)
            tried = []
            t1 = time.perf_counter()
            for t in (near if a.near else candidates)(tk, M_P, n, k, SHAPES[name].head_dim):
                if time.perf_counter() - t1 > per_kernel:
                    break
                try:
                    us = time_us(lambda i, t=t, f=launch: f(i, t), copies)
                except Exception as e:  # a shape the compiler refuses (registers, shared memory)
                    print(f"  {name} M={M} {kind} {t}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                tried.append({"tile": t.__dict__, "us": us, "gb_s": nbytes / us / 1e3})
            tried.sort(key=lambda r: r["us"])
            best = tried[0] if tried else {"tile": default.__dict__, "us": d_us, "gb_s": nbytes / d_us / 1e3}
            row = {"shape": name, "rows": M, "kernel": kind, "n": n, "k": k, "weight_bytes": nbytes,
                   "default": {"tile": default.__dict__, "us": d_us, "gb_s": nbytes / d_us / 1e3},
                   "best": best, "top5": tried[:5], "tried": len(tried),
                   "cublas_path": {"us": c_us, "gb_s": nbytes / c_us / 1e3}}
            results.append(row)
            line = (f"| {name} | {M} | {kind} | {default} | {d_us:.2f} | {nbytes / d_us / 1e3:,.0f} | "
                    f"{ck.Tile(**best['tile'])} | {best['us']:.2f} | {best['gb_s']:,.0f} | {c_us:.2f} | "
                    f"{nbytes / c_us / 1e3:,.0f} |")
            md.append(line)
            print(line, f"({len(tried)} tried, {time.perf_counter() - t0:.0f}s)", flush=True)
            (out / "sweep.json").write_text(json.dumps(results, indent=1))
            (out / "sweep.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
