"""Candidates for the end of a GPU decode step, benched but not served: bench/argmax_kernel.py's
many-program argmax against torch's argmax (the first of tied maxima, a NaN as the largest, -0.0
tying +0.0, rows of -inf, a vocabulary that is no multiple of the chunk; the row counters left at
zero), and bench/head_gemv.py's norm + LM head GEMV in one kernel against the served norm, cast
and F.linear. Without a GPU the kernels run in Triton's interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="the kernel needs triton (dev extra)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import argmax_kernel  # noqa: E402
import head_gemv  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def test_argmax_rows_is_torchs_argmax() -> None:
    g = torch.Generator().manual_seed(3)
    V = 2 * argmax_kernel.CHUNK + 77
    x = torch.randn(7, V, generator=g)
    x[1, 5] = x[1, V - 3] = 100.0  # a tie across chunks: the lower position
    x[2, 40] = x[2, 41] = 100.0  # a tie within a chunk
    x[3, V - 1] = float("nan")
    x[3, 9] = float("inf")  # a NaN beats +inf
    x[4] = float("-inf")  # nothing but -inf: position 0
    x[5] = 0.0
    x[5, 0] = -0.0  # -0.0 ties +0.0: position 0
    x[6, 3 * V // 4] = float("nan")
    x[6, V - 2] = float("nan")
    x = x.to(DEV)
    counters = torch.zeros(7, dtype=torch.int32, device=DEV)
    for _ in range(2):  # the counters come back to zero for the next launch
        assert torch.equal(argmax_kernel.argmax_rows(x, counters), x.argmax(-1))
        assert not counters.any()


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
