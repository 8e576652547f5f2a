"""A candidate for the end of a GPU decode step, benched but not served: bench/chunk_refine.py's
refinement in one kernel (every chunk's best 32 recomputed) against its torch reference and the
served refinement's choices. Without a GPU the kernel runs in Triton's interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="the kernel needs triton (dev extra)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import chunk_refine  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def test_chunk_refine_recomputes_every_chunks_best() -> None:
    """Each chunk's best 32 (the lower position first among equal logits) recomputed in float32, the
    rest the low-precision logits exactly: 40 of the row's best in its first chunk (32 of them refined
    there), a last chunk shorter than the others; the greedy choice as the served refinement's, and
    the logits it refines refined alike. One row: each program takes ~3 s in Triton's interpreter."""
    from switchyard.engine.backends.cuda import head_kernels as hk

    g = torch.Generator().manual_seed(5)
    V, hid, N = 2 * 2048 + 900, 40, 1
    w = 0.1 * torch.randn(V, hid, generator=g)
    h = torch.randn(N, hid, generator=g)
    w[:40] += 10.0 * h[0] / h[0].dot(h[0])  # the row's best 40 in chunk 0, 10 above the rest
    raw = (h @ w.T + 0.05 * torch.randn(N, V, generator=g)).to(torch.bfloat16)  # a head wrong by more than bf16
    got = chunk_refine.chunk_refine(raw.to(DEV), w.to(DEV), h.to(DEV), 32).cpu()
    ref = chunk_refine.reference(raw, w, h, 32)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    refined = got != raw.float()
    assert refined.sum(1).tolist() == [32 * 3]  # three chunks' best 32, each moved off bf16
    assert refined[0, :40].sum() == 32
    served = hk.refine(raw, w, h, 32) if DEV == "cpu" else hk.refine(raw.to(DEV), w.to(DEV), h.to(DEV), 32).cpu()
    assert torch.equal(got.argmax(-1), served.argmax(-1))
    moved = served != raw.float()  # the served refinement's 32 a row, which this one refines too
    assert moved.sum(1).tolist() == [32]
    torch.testing.assert_close(got[moved], served[moved], atol=1e-5, rtol=1e-5)
