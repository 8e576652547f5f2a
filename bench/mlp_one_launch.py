"""A one-row decode step's MLP in one launch (backends/cuda/kernels.mlp) against the two launches it
replaces (gate_up_silu, then gemv_residual over down), on a GPU: a chain of o_proj + MLP over 30 layers
of distinct random weights (so that no layer's weights sit in L2), launched with PDL as the decode
step launches them, captured in a CUDA graph; microseconds a layer, the median of alternated rounds.

  python bench/mlp_one_launch.py --shapes 576x1536,1024x3072 --rounds 3

Each launch shape of the one-launch kernel is a row: rows of the intermediate a program, warps, down
rows a load, and whether down is read from a transposed copy ([I, hidden]: each program's slice
contiguous, at the cost of a second copy of the weight).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from switchyard.engine.backends.cuda import kernels as ck
from switchyard.engine.backends.cuda.triton_common import pdl_supported

LAYERS = 30
SHAPES = [(16, 8, 1024, False), (16, 4, 1024, False), (32, 8, 1024, False), (8, 4, 1024, False),
          (16, 8, 256, False), (4, 4, 1024, True), (8, 4, 1024, True), (16, 4, 1024, True), (8, 4, 256, True),
          (4, 2, 1024, True)]


def chain(hidden: int, inter: int, shape: tuple[int, int, int, bool] | None, pdl: bool) -> float:
    """us a layer of the chain's graph, replayed; shape None: the two launches."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*s: int, std: float = 0.05) -> torch.Tensor:
        return (torch.randn(*s, generator=g, device=dev) * std).to(torch.bfloat16)

    ws = [(rand(hidden, hidden), rand(2 * inter, hidden), rand(hidden, inter)) for _ in range(LAYERS)]
    if shape is not None and shape[3]:
        ws = [(wo, wgu, wd.t().contiguous()) for wo, wgu, wd in ws]
    ln = torch.ones(hidden, device=dev)
    o = rand(1, hidden, std=1.0)
    x0 = torch.randn(1, hidden, generator=g, device=dev)

    def run() -> torch.Tensor:
        x = x0
        for wo, wgu, wd in ws:
            if shape is None:
                x = ck.gemv_residual(o, wo, x, pdl=pdl)
                x = ck.gemv_residual(ck.gate_up_silu(x, ln, wgu, 1e-5, pdl=pdl), wd, x, pdl=pdl)
            else:
                acc = torch.empty_like(x)
                x = ck.gemv_residual(o, wo, x, pdl=pdl, out2=acc)
                x = ck.mlp(x, ln, wgu, wd, acc, 1e-5, pdl=pdl, rows=shape[0], warps=shape[1], block_n=shape[2],
                           transposed=shape[3])
        return x

    run()
    torch.cuda.synchronize()
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        run()
    for _ in range(20):
        gr.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    n = 200
    for _ in range(n):
        gr.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / n / LAYERS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="576x1536,1024x3072", help="hidden x intermediate, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    pdl = pdl_supported(torch.device("cuda"))
    print(f"# One row's o_proj + MLP a layer, {torch.cuda.get_device_name()}, PDL {pdl}: us a layer "
          f"(median of {a.rounds} alternated rounds)\n")
    print("| hidden x inter | launches | rows | warps | down rows a load | down transposed | us a layer | / two launches |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for text in a.shapes.split(","):
        hidden, inter = (int(v) for v in text.split("x"))
        cases: list[tuple[int, int, int, bool] | None] = [None, *SHAPES]
        times: dict[int, list[float]] = {i: [] for i in range(len(cases))}
        for _ in range(a.rounds):
            for i, sh in enumerate(cases):
                times[i].append(chain(hidden, inter, sh, pdl))
        base = statistics.median(times[0])
        for i, sh in enumerate(cases):
            t = statistics.median(times[i])
            cols = "two | | | | |" if sh is None else f"one | {sh[0]} | {sh[1]} | {sh[2]} | {'yes' if sh[3] else 'no'} |"
            print(f"| {hidden} x {inter} | {cols} {t:.2f} | {t / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
