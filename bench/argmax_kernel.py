"""A greedy step's argmax over the vocabulary in one Triton launch of many programs (the sampler's on
a GPU since 2026-12-06, head_kernels.RowArgmax), against torch's argmax, on the GPU's clock.

Why: in a SmolLM2 decode step at batch 1 on an H100, torch's argmax over 49,152 float32 logits
took 13.4 us of a 0.431 ms step (bench/results/gpu_attention_early/, call 8): a reduction of one
row runs in few blocks. Here a program takes a chunk of a row, keeps its best as a 64-bit key (the
logit's order as an integer in the high half, 2^31 - 1 - its position in the low, so the lower
position wins a tie, as torch's argmax promises; a NaN is the largest, as in torch), and the last
program of the row to finish (a counter per row, left at zero) takes the best of the chunks'.
Each size in a CUDA graph of 20 launches (cuda_kernels_sweep.time_us):

  python bench/argmax_kernel.py --rows 1,16,64 --vocab 49152,128256
"""

from __future__ import annotations

import argparse

import torch
from cuda_kernels_sweep import time_us

from switchyard.engine.backends.cuda.head_kernels import RowArgmax


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--vocab", default="49152,128256")
    a = ap.parse_args()
    print(f"# argmax over a step's logits, {torch.cuda.get_device_name()}: us a launch in a CUDA graph\n")
    print("| rows | vocabulary | torch argmax | ours | torch / ours |")
    print("| --- | --- | --- | --- | --- |")
    for v in (int(s) for s in a.vocab.split(",")):
        for n in (int(s) for s in a.rows.split(",")):
            x = torch.randn(n, v, device="cuda")
            x[:, v // 3] = x[:, 2 * v // 3] = x.max() + 1  # a tie: the lower position wins
            am = RowArgmax()
            assert torch.equal(am(x), x.argmax(-1)), (n, v)
            theirs = time_us(lambda i, x=x: x.argmax(-1), 20)
            ours = time_us(lambda i, x=x, am=am: am(x), 20)
            print(f"| {n} | {v:,} | {theirs:.2f} | {ours:.2f} | {theirs / ours:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
