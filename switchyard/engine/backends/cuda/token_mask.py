"""A step's grammar masks applied to GPU logits in one Triton kernel.

The torch path (backends/cpu/token_mask.apply_token_bitmask_torch) takes four or five launches
(the bits ANDed with the powers of two, compared with zero, the masked fill, the padding past the
mask, and for some rows an index_select and index_copy); at SmolLM2's 0.65 ms step the host's
launches are the step's pace, so one kernel reads each masked row's bitmask words and writes -inf
where a token's bit is clear, in place, into the masked rows only. The bitmask goes up as in the
torch path: from pinned memory, queued, the host never waiting.
"""

from __future__ import annotations

import torch

# triton_common sets TRITON_INTERPRET before triton loads (no GPU: the kernel is interpreted).
from switchyard.engine.backends.cuda.triton_common import tl, triton
from switchyard.engine.backends.transfer import upload

BLOCK = 2048  # tokens a program: 49k-128k vocabularies give 24-63 programs a row


@triton.jit
def _bitmask_kernel(logits_ptr, stride_l, bm_ptr, words, rows_ptr, V, n_bits,
                    BLOCK: tl.constexpr, ROWS: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + r).to(tl.int64) if ROWS else r.to(tl.int64)
    # Bits past the mask (a vocabulary padded past the grammar's tokenizer) read as 0: never allowed.
    w = tl.load(bm_ptr + r * words + cols // 32, mask=cols < n_bits, other=0)
    blocked = ((w >> (cols % 32)) & 1) == 0
    neg = tl.full((BLOCK,), float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * stride_l + cols, neg, mask=(cols < V) & blocked)


def apply_token_bitmask_cuda(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """logits [B, V] in place (rows contiguous: a row's tokens side by side); bitmask int32
    [>= B, W] on the host, pinned for a copy without a wait; rows: the masked rows. The same
    -inf's as apply_token_bitmask_torch (tests/engine/test_cuda_kernels.py)."""
    if not rows:
        return
    if logits.stride(1) != 1:
        from switchyard.engine.backends.cpu.token_mask import apply_token_bitmask_torch
        apply_token_bitmask_torch(logits, bitmask, rows)
        return
    dev = logits.device
    B, V = logits.shape
    every = len(rows) == B and rows == list(range(B))
    bm = upload(bitmask[:B] if every else bitmask[rows], torch.int32, dev)
    idx = bm if every else upload(rows, torch.int64, dev)  # not read when every row is masked
    W = bm.shape[1]
    _bitmask_kernel[(len(rows), triton.cdiv(V, BLOCK))](logits, logits.stride(0), bm, W, idx, V, min(V, W * 32),
                                                        BLOCK=BLOCK, ROWS=not every)
