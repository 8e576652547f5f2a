"""The LM head's refinement in one kernel: each chunk's best 32 low-precision logits recomputed in
float32 by the program that found them, against the served two kernels (head_kernels.refine: each
chunk's best 32 kept as keys, then the row's best 32 of those recomputed by a second launch).

Why: in a SmolLM2 decode step at batch 1 on an H100 the served pair took 12.3 us (chunk top-32 4.4,
refine 7.7: each of its programs sorts the row's 768 keys again) of a ~0.41 ms step, and a launch
less shortens the step's chain of dependent kernels (bench/results/gpu_head/). What changes: a
superset of the row's best 32 is refined (every chunk's best 32, 768 logits at SmolLM2's 24 chunks,
which hold the row's best 32 whatever they are), so greedy choices and top logprobs stay exact; the
rest keep the low-precision value, as before. The cost: each program reads its 32 rows of the float32
head (74 KB at SmolLM2's 576 wide, 512 KB at the 8B shape's 4,096: a narrow model's candidate).

Not served: on an H100 it took 6.40 us against the pair's 9.25 alone, and SmolLM2's step 0.423 ms
against 0.421 over 9 alternated rounds (bench/results/gpu_head call 9). Each in a CUDA graph of 20
launches (cuda_kernels_sweep.time_us), and in the step as the bench backend `cuda-chunk-refine`
(engine_cuda_variants):

  python bench/chunk_refine.py --shapes 49152x576,128256x4096 --rows 1,16
"""

from __future__ import annotations

import argparse

import torch

# isort: off
from switchyard.engine.backends.cuda.triton_common import _pdl_wait, tl, triton  # sets TRITON_INTERPRET first
from switchyard.engine.backends.cuda import head_kernels as hk
# isort: on


@triton.jit
def _chunk_refine_kernel(raw_ptr, w_ptr, h_ptr, out_ptr, V, HID, CHUNK: tl.constexpr, K: tl.constexpr,
                         BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    # Program (row, chunk): the chunk's logits as float32, its best K (head_kernels._chunk_best)
    # recomputed as h . w[i] in float32.
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    x, i, live, _, pos = hk._chunk_best(raw_ptr, row, tl.program_id(1), V, CHUNK, K)
    pos = pos.to(tl.int64)
    ok = pos < V  # a last chunk with fewer than K logits also picks positions past V
    acc = tl.zeros([K, BLOCK_H], dtype=tl.float32)
    for c0 in range(0, HID, BLOCK_H):
        c = c0 + tl.arange(0, BLOCK_H)
        cm = c < HID
        wv = tl.load(w_ptr + pos[:, None] * HID + c[None, :], mask=ok[:, None] & cm[None, :], other=0.0)
        acc += wv * tl.load(h_ptr + row * HID + c, mask=cm, other=0.0)[None, :]
    tl.store(out_ptr + row * V + i, x.to(tl.float32), mask=live)
    tl.debug_barrier()  # the chunk's float32 copy before the refined values over it (other threads' stores)
    tl.store(out_ptr + row * V + pos, tl.sum(acc, axis=1), mask=ok)


def chunk_refine(raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int, pdl: bool = False) -> torch.Tensor:
    """As head_kernels.refine (raw [N, V] 16-bit logits, w [V, hidden] the float32 head, h [N, hidden]
    float32 -> float32 [N, V]), with every chunk's best k recomputed rather than the row's best k."""
    N, V = raw.shape
    hid = w.shape[1]
    assert raw.element_size() == 2 and raw.is_floating_point(), "a 16-bit head's logits"
    assert k & (k - 1) == 0 and k <= V, "k: a power of two, at most the vocabulary"
    raw, h = raw.contiguous(), h.contiguous()
    chunk = max(2048, triton.next_power_of_2(triton.cdiv(V, 32)))  # head_kernels.refine's chunks
    assert chunk <= 65536, "a vocabulary of at most 2M"
    out = torch.empty(N, V, dtype=torch.float32, device=raw.device)
    _chunk_refine_kernel[(N, triton.cdiv(V, chunk))](raw, w, h, out, V, hid, CHUNK=chunk, K=k,
                                                     BLOCK_H=min(128, triton.next_power_of_2(hid)), PDL=pdl,
                                                     num_warps=8, launch_pdl=pdl)
    return out


def reference(raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int) -> torch.Tensor:
    """chunk_refine in torch's ops: each chunk's best k (the lower position first among equals)
    recomputed in float32."""
    N, V = raw.shape
    chunk = max(2048, triton.next_power_of_2(triton.cdiv(V, 32)))
    out = raw.float().clone()
    for r in range(N):
        for c0 in range(0, V, chunk):
            seg = raw[r, c0: c0 + chunk].float()
            n = min(k, seg.numel())
            # stable descending order: equal logits keep their positions' order
            pick = c0 + torch.sort(seg, descending=True, stable=True).indices[:n]
            out[r, pick] = w[pick].float() @ h[r].float()
    return out


def main() -> None:
    from cuda_kernels_sweep import time_us

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="49152x576,128256x4096", help="vocabulary x hidden")
    ap.add_argument("--rows", default="1,16")
    a = ap.parse_args()
    print(f"# The LM head's refinement, {torch.cuda.get_device_name()}: us a launch in a CUDA graph\n")
    print("| vocabulary x hidden | rows | served (two kernels) | one kernel | served / one | greedy choices alike |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape in a.shapes.split(","):
        V, K = (int(s) for s in shape.split("x"))
        w = torch.randn(V, K, device="cuda") * 0.05
        for n in (int(s) for s in a.rows.split(",")):
            h = torch.randn(n, K, device="cuda")
            raw = (h @ w.T).to(torch.bfloat16)
            alike = int((chunk_refine(raw, w, h, 32).argmax(-1) == hk.refine(raw, w, h, 32).argmax(-1)).sum())
            served = time_us(lambda i, raw=raw, w=w, h=h: hk.refine(raw, w, h, 32), 20)
            one = time_us(lambda i, raw=raw, w=w, h=h: chunk_refine(raw, w, h, 32), 20)
            print(f"| {V:,} x {K:,} | {n} | {served:.2f} | {one:.2f} | {served / one:.2f}x | {alike} of {n} |",
                  flush=True)


if __name__ == "__main__":
    main()
