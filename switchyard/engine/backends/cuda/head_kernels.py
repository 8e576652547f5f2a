"""The end of a GPU step's LM head in two Triton kernels: a low-precision head's logits [N, V]
made float32, their best `k` of each row found, and those recomputed against the float32 head
(model/decoder.py's refine: greedy choices and top logprobs exact).

Why: torch's path is the float copy, a radix top-k (about ten kernels for one row of a 49k
vocabulary), a gather of the rows, a batched matmul and a scatter: ~20 launches and ~60 us of a
SmolLM2 decode step on an H200 at batch 1 (bench/results/gpu_pdl/), a tenth of the step. Here:

1. `_chunk_top_kernel`, program (row, chunk): the chunk's logits written as float32 and its best
   k kept as keys, each a logit's order-preserving integer in the high bits and its position in
   the low (the lower position first among equal logits);
2. `_refine_kernel`, program (row, j): the j-th best of the chunks' keys, its float32 dot product
   against the head's row, written over the low-precision logit.

A head whose logits are float32 (an int4 head's) keeps torch's path (backend.refine).
"""

from __future__ import annotations

# isort: off
from switchyard.engine.backends.cuda.triton_common import _pdl_wait  # sets TRITON_INTERPRET first
import torch
import triton
import triton.language as tl
# isort: on


@triton.jit
def _chunk_top_kernel(raw_ptr, out_ptr, keys_ptr, V, CHUNK: tl.constexpr, K: tl.constexpr, PDL: tl.constexpr):
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    local = tl.arange(0, CHUNK)
    i = chunk * CHUNK + local
    live = i < V
    x = tl.load(raw_ptr + row * V + i, mask=live, other=float("-inf"))
    tl.store(out_ptr + row * V + i, x.to(tl.float32), mask=live)
    # A 16-bit float's order as a signed integer's in the high half, 2^16 - 1 - the position in
    # the chunk in the low (the lower position first among equal logits): a 32-bit sort, half
    # the work of sorting 64-bit keys.
    b = x.to(tl.int16, bitcast=True).to(tl.int32)
    key = ((b ^ ((b >> 15) & 0x7FFF)) << 16) | (0xFFFF - local)
    best = tl.topk(key, K)
    # The chunk's best as 64-bit keys of the row: the order in the high half, 2^31 - 1 - the
    # position in the row in the low.
    pos = chunk * CHUNK + 0xFFFF - (best & 0xFFFF)
    wide = ((best >> 16).to(tl.int64) << 32) | (0x7FFFFFFF - pos).to(tl.int64)
    tl.store(keys_ptr + (row * tl.num_programs(1) + chunk) * K + tl.arange(0, K), wide)


@triton.jit
def _refine_kernel(keys_ptr, w_ptr, h_ptr, out_ptr, V, HID, NK, K: tl.constexpr, NK_P: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr):
    # Program (row, j): the row's j-th best of the chunks' keys (each program of the row sorts
    # them: a few us, where one program reading the k head rows in turn took ~50 us on the 8B
    # shape), its logit recomputed in float32.
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    n = tl.arange(0, NK_P)
    keys = tl.load(keys_ptr + row * NK + n, mask=n < NK, other=-9223372036854775807)
    best = tl.topk(keys, K)
    pick = tl.sum(tl.where(tl.arange(0, K) == j, best, 0), axis=0)
    pos = (0x7FFFFFFF - (pick & 0x7FFFFFFF)).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in range(0, HID, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        live = c < HID
        acc += tl.load(w_ptr + pos * HID + c, mask=live, other=0.0) * tl.load(h_ptr + row * HID + c, mask=live, other=0.0)
    tl.store(out_ptr + row * V + pos, tl.sum(acc, axis=0))


def refine(raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int, pdl: bool = False) -> torch.Tensor:
    """raw [N, V] logits of a 16-bit low-precision head; w [V, hidden] the float32 head; h [N, hidden]
    float32 -> float32 [N, V]: raw, with each row's best k recomputed as h . w[i] in float32."""
    N, V = raw.shape
    hid = w.shape[1]
    assert raw.element_size() == 2 and raw.is_floating_point(), "a 16-bit head's logits"
    assert k & (k - 1) == 0 and k <= V, "k: a power of two, at most the vocabulary"
    raw, h = raw.contiguous(), h.contiguous()
    # Chunks of at least 2048 logits, at most 32 a row (and 65536, the key's position bits): a 49k
    # vocabulary's 24 chunks leave 768 keys for the second kernel, a 128k one's 32 of 4096, 1024.
    chunk = max(2048, triton.next_power_of_2(triton.cdiv(V, 32)))
    assert chunk <= 65536, "a vocabulary of at most 2M"
    chunks = triton.cdiv(V, chunk)
    out = torch.empty(N, V, dtype=torch.float32, device=raw.device)
    keys = torch.empty(N, chunks * k, dtype=torch.int64, device=raw.device)
    _chunk_top_kernel[(N, chunks)](raw, out, keys, V, CHUNK=chunk, K=k, PDL=pdl, num_warps=8, launch_pdl=pdl)
    _refine_kernel[(N, k)](keys, w, h, out, V, hid, chunks * k, K=k, NK_P=triton.next_power_of_2(chunks * k),
                           BLOCK=min(1024, triton.next_power_of_2(hid)), PDL=pdl, num_warps=4, launch_pdl=pdl)
    return out
