"""The GPU decoder's start-up, before it serves: the fused kernels checked against the torch
ops (as the collectives have their start-up test), the decode graphs of every batch bucket
captured, and the attention kernel compiled for every span bucket."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from switchyard.engine.backends.cuda.graphs import BATCH_BUCKETS, batch_bucket, len_bucket
from switchyard.engine.model.step import Step

# `m` below is a CudaModel, not imported: cuda_decoder imports this module.
CudaModel = Any

log = logging.getLogger("switchyard.engine.model.cuda_warmup")


def warmup(m: CudaModel) -> float:
    """Compile the fused ops and capture the decode graphs of every batch bucket (at the
    shortest span) before serving, so the first requests do not pay for them. Writes only
    into slot 0's blocks (and the spare), which no request reads before its own prefill or
    decode writes them (the scheduler's pool has no keys for them). Every TP rank must call
    it (its collectives pair up). Returns the seconds it took."""
    start = time.perf_counter()
    n = 8
    one = torch.ones(1, dtype=torch.int64)
    if m.decode_impl == "fused":
        check_fused(m, n)
    m.forward(Step(torch.zeros(1, n, dtype=torch.int64), torch.arange(n).view(1, n), torch.zeros_like(one),
                      one * n, one * n, 0))
    for S in sorted({batch_bucket(b, m.max_slots) for b in BATCH_BUCKETS if b <= m.max_slots}
                    | {m.max_slots}):
        m.forward(Step(torch.zeros(1, 1, dtype=torch.int64), (one * n).view(1, 1), torch.zeros_like(one), one,
                          one * (n + 1), S))
    if m.decode_impl == "fused" and m.device.type == "cuda":
        compile_attention_spans(m)
    if m.device.type == "cuda":
        torch.cuda.synchronize(m.device)
    return time.perf_counter() - start

def check_fused(m: CudaModel, n: int, tol: float = 0.5) -> None:
    """Start-up check of the fused kernels (as the collectives have one): a prefill and one
    decode step of slot 0 through both paths, graphs off; a failure or logits further apart
    than `tol` x their std keeps the torch ops, with the reason in status(). It catches a
    kernel that computes something else (NaN, or logits a std or more apart), not rounding:
    two bfloat16 paths over a random 8B model's 32 layers differ by 0.18-0.25 x std on an
    H200 (the accuracy bound against the float32 engine is the GPU tests' job)."""
    one = torch.ones(1, dtype=torch.int64)
    args = Step(torch.tensor([[3]]), (one * n).view(1, 1), torch.zeros_like(one), one, one * (n + 1), 1)
    enabled, m.graphs.enabled = m.graphs.enabled, False
    prompt = Step(torch.arange(n).view(1, n) % 7, torch.arange(n).view(1, n), torch.zeros_like(one), one * n, one * n)
    what = "prefill"
    try:
        for what, a in (("prefill", prompt), ("decode", args)):
            m.decode_impl = "torch"
            ref = m.forward(a).float()
            m.decode_impl = "fused"
            err = float((m.forward(a).float() - ref).abs().max() / ref.std())
            if not err <= tol:  # NaN too
                m.decode_impl, m.decode_reason = "torch", f"fused {what} check: logits {err:.3g} x std apart"
                break
    except Exception as e:  # a kernel that does not compile or launch on this device
        m.decode_impl, m.decode_reason = "torch", f"fused {what} check failed: {type(e).__name__}: {e}"[:300]
    finally:
        m.graphs.enabled = enabled
    if m.decode_reason:
        log.warning("%s; decoding with the torch ops", m.decode_reason)

def compile_attention_spans(m: CudaModel) -> None:
    """The attention kernel is compiled once per span bucket (its split count and chunk are
    constants): compile them all now, reading the spare block only, rather than on the step
    whose context first crosses into a bucket."""
    from switchyard.engine.backends.cuda import kernels as ck

    q = torch.zeros(1, m.heads, m.hd, dtype=m.dtype, device=m.device)
    ctx = torch.ones(1, dtype=torch.int64, device=m.device)
    longest = 1
    while longest < m.max_len:
        longest = len_bucket(longest + 1, m.max_len)
        span = -(-longest // m.block_size) * m.block_size  # as forward() rounds it
        tables = torch.full((1, span // m.block_size), m.num_blocks, dtype=torch.int64, device=m.device)
        ck.paged_attention(q, m.k_cache[0], m.v_cache[0], tables, ctx, span)  # type: ignore[index]
