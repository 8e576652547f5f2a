"""Candidates for the end of a GPU decode step, benched but not served: bench/head_gemv.py's norm +
LM head GEMV in one kernel against the served norm, cast and F.linear (it lost to cuBLAS on an H100,
bench/results/gpu_head/); bench/chunk_refine.py's refinement in one kernel (every chunk's best 32
recomputed) against its torch reference and the served refinement's choices. Without a GPU the
kernels run in Triton's interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="the kernel needs triton (dev extra)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import chunk_refine  # noqa: E402
import head_gemv  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("M", [1, 3])
def test_norm_gemv_is_the_served_heads_logits(M: int) -> None:
    g = torch.Generator().manual_seed(M)
    V, K = 300, 96  # no multiple of the tile's rows
    w = (0.05 * torch.randn(V, K, generator=g)).to(torch.bfloat16).to(DEV)
    ln = (1 + 0.1 * torch.randn(K, generator=g)).to(DEV)
    x = (3 * torch.randn(M, K, generator=g)).to(DEV)
    h_ref, ref = head_gemv.served(x, ln, w, 1e-5)
    h, got = head_gemv.fused(x, ln, w, 1e-5)
    assert got.dtype == torch.bfloat16 and got.shape == (M, V)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(got.float(), ref.float(), atol=2e-2, rtol=1.6e-2)  # bf16 outputs, two sum orders


def test_chunk_refine_recomputes_every_chunks_best() -> None:
    """Each chunk's best 32 (the lower position first among equal logits) recomputed in float32, the
    rest the low-precision logits exactly: 40 of a row's best in its first chunk (32 of them refined
    there), a last chunk shorter than the others; the greedy choice as the served refinement's, and
    the logits it refines refined alike."""
    from switchyard.engine.backends.cuda import head_kernels as hk

    g = torch.Generator().manual_seed(5)
    V, hid, N = 2 * 2048 + 900, 40, 2
    w = 0.1 * torch.randn(V, hid, generator=g)
    h = torch.randn(N, hid, generator=g)
    w[:40] += 10.0 * h[1] / h[1].dot(h[1])  # row 1's best 40 in chunk 0, 10 above the rest
    raw = (h @ w.T + 0.05 * torch.randn(N, V, generator=g)).to(torch.bfloat16)  # a head wrong by more than bf16
    got = chunk_refine.chunk_refine(raw.to(DEV), w.to(DEV), h.to(DEV), 32).cpu()
    ref = chunk_refine.reference(raw, w, h, 32)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    refined = got != raw.float()
    assert refined.sum(1).tolist() == [32 * 3, 32 * 3]  # three chunks' best 32, each moved off bf16
    assert refined[1, :40].sum() == 32
    served = hk.refine(raw, w, h, 32) if DEV == "cpu" else hk.refine(raw.to(DEV), w.to(DEV), h.to(DEV), 32).cpu()
    assert torch.equal(got.argmax(-1), served.argmax(-1))
    moved = served != raw.float()  # the served refinement's 32 a row, which this one refines too
    assert moved.sum(1).tolist() == [32, 32]
    torch.testing.assert_close(got[moved], served[moved], atol=1e-5, rtol=1e-5)
