"""The end of a GPU step's LM head in two Triton kernels: a low-precision head's logits [N, V]
made float32, their best `k` of each row found, and those recomputed against the float32 head
(model/decoder.py's refine: greedy choices and top logprobs exact).

Why: torch's path is the float copy, a radix top-k (about ten kernels for one row of a 49k
vocabulary), a gather of the rows, a batched matmul and a scatter: ~20 launches and ~60 us of a
SmolLM2 decode step on an H200 at batch 1 (bench/results/gpu_pdl/), a tenth of the step. Here:

1. `_chunk_top_kernel`, program (row, chunk): the chunk's logits written as float32 and its best
   k kept as keys, each a logit's order-preserving integer in the high 32 bits and the position in
   the low (the lower position first among equal logits);
2. `_refine_kernel`, program (row): the best k of the chunks' keys, their float32 dot products
   against the head's rows, written over the low-precision logits.
"""

from __future__ import annotations

# isort: off
from switchyard.engine.backends.cuda.triton_common import _pdl_start, _pdl_wait  # sets TRITON_INTERPRET first
import torch
import triton
import triton.language as tl
# isort: on


@triton.jit
def _chunk_top_kernel(raw_ptr, out_ptr, keys_ptr, V, CHUNK: tl.constexpr, K: tl.constexpr, PDL: tl.constexpr):
    _pdl_start(PDL)
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    i = chunk * CHUNK + tl.arange(0, CHUNK)
    live = i < V
    x = tl.load(raw_ptr + row * V + i, mask=live, other=float("-inf")).to(tl.float32)
    tl.store(out_ptr + row * V + i, x, mask=live)
    b = x.to(tl.int32, bitcast=True)
    ordered = b ^ ((b >> 31) & 0x7FFFFFFF)  # a float's order as a signed integer's
    # the low 31 bits: 2^31 - 1 - position, so that the lower position sorts first among equals
    key = (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - i).to(tl.int64)
    best = tl.topk(key, K)
    tl.store(keys_ptr + (row * tl.num_programs(1) + chunk) * K + tl.arange(0, K), best)


@triton.jit
def _refine_kernel(keys_ptr, w_ptr, h_ptr, out_ptr, V, HID, NK, K: tl.constexpr, NK_P: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr):
    _pdl_start(PDL)
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NK_P)
    keys = tl.load(keys_ptr + row * NK + j, mask=j < NK, other=-9223372036854775807)
    best = tl.topk(keys, K)
    pos = 0x7FFFFFFF - (best & 0x7FFFFFFF)
    acc = tl.zeros([K, BLOCK], dtype=tl.float32)
    for c0 in range(0, HID, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        live = c < HID
        w = tl.load(w_ptr + pos[:, None] * HID + c[None, :], mask=live[None, :], other=0.0)
        hv = tl.load(h_ptr + row * HID + c, mask=live, other=0.0)
        acc += w * hv[None, :]
    tl.store(out_ptr + row * V + pos, tl.sum(acc, axis=1))


def refine(raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int, pdl: bool = False) -> torch.Tensor:
    """raw [N, V] logits of a low-precision head; w [V, hidden] the float32 head; h [N, hidden]
    float32 -> float32 [N, V]: raw, with each row's best k recomputed as h . w[i] in float32."""
    N, V = raw.shape
    hid = w.shape[1]
    assert k & (k - 1) == 0 and k <= V, "k: a power of two, at most the vocabulary"
    raw, h = raw.contiguous(), h.contiguous()
    # Chunks of at least 2048 logits, at most 32 a row: a 49k vocabulary's 24 chunks leave 768
    # keys for the second kernel, a 128k one's 32 chunks of 4096 leave 1024.
    chunk = max(2048, triton.next_power_of_2(triton.cdiv(V, 32)))
    chunks = triton.cdiv(V, chunk)
    out = torch.empty(N, V, dtype=torch.float32, device=raw.device)
    keys = torch.empty(N, chunks * k, dtype=torch.int64, device=raw.device)
    _chunk_top_kernel[(N, chunks)](raw, out, keys, V, CHUNK=chunk, K=k, PDL=pdl, num_warps=8, launch_pdl=pdl)
    _refine_kernel[(N,)](keys, w, h, out, V, hid, chunks * k, K=k, NK_P=triton.next_power_of_2(chunks * k),
                         BLOCK=128, PDL=pdl, num_warps=4, launch_pdl=pdl)
    return out
