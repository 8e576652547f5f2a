"""A candidate for the end of a GPU decode step, benched but not served: bench/head_gemv.py's norm +
LM head GEMV in one kernel against the served norm, cast and F.linear (it lost to cuBLAS on an H100,
bench/results/gpu_head/). Without a GPU the kernel runs in Triton's interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="the kernel needs triton (dev extra)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
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
