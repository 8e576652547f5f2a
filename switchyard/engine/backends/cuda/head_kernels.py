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

And the greedy rows' choice after it (and after the grammar's masks), RowArgmax: torch's argmax
runs a row's reduction in few blocks, 11.9 us over 49,152 float32 logits on an H100 where one
launch of a program per 2,048 logits took 2.9 (26.5 against 3.1 us at 128,256;
bench/results/gpu_head/).
"""

from __future__ import annotations

# isort: off
from switchyard.engine.backends.cuda.triton_common import HandleLaunch, _pdl_wait  # sets TRITON_INTERPRET first
import torch
import triton
import triton.language as tl
# isort: on


@triton.jit
def _chunk_best(raw_ptr, row, chunk, V, CHUNK: tl.constexpr, K: tl.constexpr):
    """Chunk `chunk` of a row's 16-bit logits (x, their positions i, which are below V) and its
    best K, (keys, their positions in the row): each key a 16-bit float's order as a signed
    integer's in the high half, 2^16 - 1 - the position in the chunk in the low (the lower
    position first among equal logits): a 32-bit sort, half the work of sorting 64-bit keys."""
    local = tl.arange(0, CHUNK)
    i = chunk * CHUNK + local
    live = i < V
    x = tl.load(raw_ptr + row * V + i, mask=live, other=float("-inf"))
    b = x.to(tl.int16, bitcast=True).to(tl.int32)
    best = tl.topk(((b ^ ((b >> 15) & 0x7FFF)) << 16) | (0xFFFF - local), K)
    return x, i, live, best, chunk * CHUNK + 0xFFFF - (best & 0xFFFF)


@triton.jit
def _chunk_top_kernel(raw_ptr, out_ptr, keys_ptr, V, CHUNK: tl.constexpr, K: tl.constexpr, PDL: tl.constexpr):
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    x, i, live, best, pos = _chunk_best(raw_ptr, row, chunk, V, CHUNK, K)
    tl.store(out_ptr + row * V + i, x.to(tl.float32), mask=live)
    # The chunk's best as 64-bit keys of the row: the order in the high half, 2^31 - 1 - the
    # position in the row in the low.
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


def refine(raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int, pdl: bool = False,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """raw [N, V] logits of a 16-bit low-precision head; w [V, hidden] the float32 head; h [N, hidden]
    float32 -> float32 [N, V]: raw, with each row's best k recomputed as h . w[i] in float32;
    written into out (float32 [N, V], rows of V contiguous logits) where given: a graph's static
    output without a copy after it (~2 us of SmolLM2's 0.40 ms step at batch 1)."""
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
    if out is None:
        out = torch.empty(N, V, dtype=torch.float32, device=raw.device)
    assert out.shape == (N, V) and out.dtype == torch.float32 and out.stride() == (V, 1), "rows of V float32 logits"
    keys = torch.empty(N, chunks * k, dtype=torch.int64, device=raw.device)
    _chunk_top_kernel[(N, chunks)](raw, out, keys, V, CHUNK=chunk, K=k, PDL=pdl, num_warps=8, launch_pdl=pdl)
    _refine_kernel[(N, k)](keys, w, h, out, V, hid, chunks * k, K=k, NK_P=triton.next_power_of_2(chunks * k),
                           BLOCK=min(1024, triton.next_power_of_2(hid)), PDL=pdl, num_warps=4, launch_pdl=pdl)
    return out


@triton.jit
def _argmax_kernel(x_ptr, stride_x, V, keys_ptr, cnt_ptr, out_ptr, CHUNK: tl.constexpr, CHUNKS_P: tl.constexpr):
    # Program (row, chunk): the chunk's best as a 64-bit key, the logit's order as an integer in the
    # high half, 2^31 - 1 - its position in the low (the lower position wins a tie, as torch's
    # argmax promises; a NaN is the largest, as there); the row's last program to count takes the
    # best of the chunks' keys and leaves the counter at zero.
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    i = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride_x + i, mask=i < V, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("nan"), x)  # one NaN, positive: above +inf once ordered
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties +0.0
    b = x.to(tl.int32, bitcast=True)
    order = b ^ ((b >> 31) & 0x7FFFFFFF)
    key = (order.to(tl.int64) << 32) | (0x7FFFFFFF - i).to(tl.int64)
    tl.store(keys_ptr + row * CHUNKS_P + chunk, tl.max(tl.where(i < V, key, -9223372036854775807), axis=0))
    tl.debug_barrier()  # every thread's store before the count
    done = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel", scope="gpu")
    if done == chunks - 1:
        c = tl.arange(0, CHUNKS_P)
        keys = tl.load(keys_ptr + row * CHUNKS_P + c, mask=c < chunks, other=-9223372036854775807, cache_modifier=".cg")
        tl.store(out_ptr + row, 0x7FFFFFFF - (tl.max(keys, axis=0) & 0x7FFFFFFF))
        tl.atomic_xchg(cnt_ptr + row, 0, sem="relaxed", scope="gpu")


ARGMAX_CHUNKS = 64  # programs a row at most: chunks of 2,048 logits up to a 131,072 vocabulary, longer past it
_argmax = HandleLaunch(_argmax_kernel, exact=2, num_warps=8)  # CHUNK, CHUNKS_P: constexprs


class RowArgmax:
    """Each row's first maximum of a step's logits on the GPU (x.argmax(-1): a NaN counts as the
    largest, -0.0 ties +0.0), in one launch; its row counters (left at zero by each launch) and
    the chunks' keys are kept between steps, grown to the most rows seen."""

    def __init__(self) -> None:
        self.counters: torch.Tensor | None = None
        self.keys: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, V] float -> [N] int64, where x is."""
        n, v = x.shape
        if x.stride(1) != 1 or v >= 2**31:
            return x.argmax(dim=-1)
        if self.counters is None or self.counters.numel() < n or self.counters.device != x.device:
            self.counters = torch.zeros(n, dtype=torch.int32, device=x.device)
            self.keys = torch.empty(n, ARGMAX_CHUNKS, dtype=torch.int64, device=x.device)
        chunk = max(2048, triton.next_power_of_2(triton.cdiv(v, ARGMAX_CHUNKS)))
        out = torch.empty(n, dtype=torch.int64, device=x.device)
        _argmax((n, triton.cdiv(v, chunk)), (x, x.stride(0), v, self.keys, self.counters, out, chunk, ARGMAX_CHUNKS))
        return out
