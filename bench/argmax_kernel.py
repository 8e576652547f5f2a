"""A greedy step's argmax over the vocabulary in one Triton launch of many programs, against
torch's argmax (the sampler's, sampling.sample_tokens), on the GPU's clock.

Why: in a SmolLM2 decode step at batch 1 on an H100, torch's argmax over 49,152 float32 logits
took 13.4 us of a 0.431 ms step (bench/results/gpu_attention_early/, call 8): a reduction of one
row runs in few blocks. Here a program takes a chunk of a row, keeps its best as a 64-bit key (the
logit's order as an integer in the high half, 2^31 - 1 - its position in the low, so the lower
position wins a tie, as torch's argmax promises; a NaN is the largest, as in torch), and the last
program of the row to finish (a counter per row, left at zero) takes the best of the chunks'.
Not served: measure it first (each size in a CUDA graph of 20 launches, cuda_kernels_sweep.time_us):

  python bench/argmax_kernel.py --rows 1,16,64 --vocab 49152,128256
"""

from __future__ import annotations

import argparse

import torch

# isort: off
from switchyard.engine.backends.cuda.triton_common import tl, triton  # sets TRITON_INTERPRET first
from cuda_kernels_sweep import time_us
# isort: on

CHUNK = 2048


@triton.jit
def _argmax_kernel(x_ptr, keys_ptr, cnt_ptr, out_ptr, V, stride_x, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    i = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride_x + i, mask=i < V, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("nan"), x)  # one NaN (positive): above +inf once ordered
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties +0.0, as in torch
    b = x.to(tl.int32, bitcast=True)
    order = b ^ ((b >> 31) & 0x7FFFFFFF)  # a float's order as a signed integer's
    key = (order.to(tl.int64) << 32) | (0x7FFFFFFF - i).to(tl.int64)
    key = tl.where(i < V, key, -9223372036854775807)
    tl.store(keys_ptr + row * chunks + chunk, tl.max(key, axis=0))
    tl.debug_barrier()  # every thread's store before the count
    done = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel", scope="gpu")
    if done == chunks - 1:
        c = tl.arange(0, 64)
        best = tl.max(tl.load(keys_ptr + row * chunks + c, mask=c < chunks, other=-9223372036854775807,
                              cache_modifier=".cg"), axis=0)
        tl.store(out_ptr + row, 0x7FFFFFFF - (best & 0x7FFFFFFF))
        tl.atomic_xchg(cnt_ptr + row, 0, sem="relaxed", scope="gpu")


def argmax_rows(x: torch.Tensor, counters: torch.Tensor | None = None) -> torch.Tensor:
    """x [N, V] float (rows contiguous) -> [N] int64: each row's first maximum (a NaN counts as the
    largest), as x.argmax(-1). counters: int32 zeros, at least N (left at zero)."""
    n, v = x.shape
    assert x.stride(1) == 1 and v < 2**31, "rows of contiguous logits"
    chunks = triton.cdiv(v, CHUNK)
    assert chunks <= 64, "a vocabulary of at most 131,072"
    keys = torch.empty(n, chunks, dtype=torch.int64, device=x.device)
    out = torch.empty(n, dtype=torch.int64, device=x.device)
    if counters is None:
        counters = torch.zeros(n, dtype=torch.int32, device=x.device)
    _argmax_kernel[(n, chunks)](x, keys, counters, out, v, x.stride(0), CHUNK=CHUNK, num_warps=8)
    return out


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
            cnt = torch.zeros(n, dtype=torch.int32, device="cuda")
            assert torch.equal(argmax_rows(x, cnt), x.argmax(-1)), (n, v)
            theirs = time_us(lambda i, x=x: x.argmax(-1), 20)
            ours = time_us(lambda i, x=x, cnt=cnt: argmax_rows(x, cnt), 20)
            print(f"| {n} | {v:,} | {theirs:.2f} | {ours:.2f} | {theirs / ours:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
