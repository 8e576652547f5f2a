"""The persistent one-row decode kernel (bench/persistent_kernel.py, the bench's `cuda-persistent`
backend: measured slower than the served five kernels a layer on an H200, so not served) against
the five kernels a layer it stands for, and through the decoder against the CPU engine.

Without a GPU the kernel runs in Triton's interpreter a stage a launch (a spin would never end
there: programs run one after another); on a GPU it runs as one launch with its grid-wide
barriers, and these tests check the barriers' counters are left at zero, that a CUDA graph
replays it, and that it computes what the five kernels do.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="the fused decode kernels need triton (dev extra)")

from switchyard.engine.model.common import embed_tokens  # noqa: E402
from switchyard.engine.model.decoder import Decoder  # noqa: E402
from switchyard.engine.model.random_weights import SMOLLM2_135M, random_weights  # noqa: E402
from switchyard.engine.model.step import Step  # noqa: E402
from switchyard.engine.model.weights import Shard  # noqa: E402
from switchyard.engine.runner.comm import SingleRank  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import engine_cuda_variants  # noqa: E402, F401  (registers cuda-persistent)
import persistent_kernel as persistent  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# Narrow widths keep the interpreter to seconds; on a GPU, SmolLM2's own (the shape it is for).
NARROW = dataclasses.replace(SMOLLM2_135M, vocab_size=1024, hidden_size=128, intermediate_size=256, num_heads=4,
                             num_kv_heads=2, head_dim=32, num_layers=2)
CFG = dataclasses.replace(SMOLLM2_135M, num_layers=4, vocab_size=4096) if DEV == "cuda" else NARROW


def _model(dtype: torch.dtype, cfg=CFG) -> Decoder:  # type: ignore[no-untyped-def]
    w = random_weights(cfg, seed=3)
    return Decoder(cfg, Shard(0, 1, cfg), w, SingleRank(), max_slots=2, max_len=1024, dtype=dtype,
                   backend="cuda-persistent", device=DEV)


def _five_kernels(m: Decoder, x: torch.Tensor, p) -> torch.Tensor:  # type: ignore[no-untyped-def]
    be = m.backend
    for layer, kc, vc in m._layer_kv:
        x, q = be.layer_in(layer, kc, vc, x, None, p)
        x, _ = be.layer_out(layer, x, be.attention(q, kc, vc, p), p)
    return x


# In the interpreter (~12 s a case, for a kernel the engine does not serve) the edges only: one
# position, and splits some past the context (the float32 decoder test below covers several
# positions in one split); all four on a GPU.
_GPU_ONLY = pytest.mark.skipif(DEV != "cuda", reason="float32, within one split / within the context: GPU only "
                               "(12 s each in Triton's interpreter; the decoder test covers the same stages)")


@pytest.mark.parametrize("dtype,ctx,span", [(torch.bfloat16, 1, 256),
                                             pytest.param(torch.float32, 20, 256, marks=_GPU_ONLY),
                                             pytest.param(torch.float32, 200, 256, marks=_GPU_ONLY),
                                             (torch.bfloat16, 700, 1024)])
def test_persistent_layers_compute_what_the_five_kernels_do(dtype: torch.dtype, ctx: int, span: int) -> None:
    """One row at several contexts (one position; one split; splits, some past the context): the
    residual and the new keys and values as the five kernels a layer leave them."""
    m = _model(dtype)
    be, d = m.backend, m.dims
    g = torch.Generator().manual_seed(ctx)
    m.k_cache.copy_(torch.randn(m.k_cache.shape, generator=g).to(m.k_cache.dtype) * 0.5)
    m.v_cache.copy_(torch.randn(m.v_cache.shape, generator=g).to(m.v_cache.dtype))
    before = m.k_cache.clone(), m.v_cache.clone()
    ids, pos, ctx_t = (torch.tensor([v], device=DEV) for v in (5, ctx - 1, ctx))
    tables = m.slot_tables(torch.tensor([1]))[:, : span // d.block_size].contiguous().to(DEV)
    p = be.decode_plan(ids, pos, ctx_t, tables, span, False)
    x = embed_tokens(ids, m.embed, m.shard, m.comm)
    want = _five_kernels(m, x.clone(), p)
    want_kv = m.k_cache.clone(), m.v_cache.clone()
    m.k_cache.copy_(before[0])
    m.v_cache.copy_(before[1])
    got = be.all_layers(x.clone(), m.k_cache, m.v_cache, p)
    assert got is not None
    assert float((want - x).abs().max()) > 1e-3  # the layers did move the residual
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(m.k_cache.float(), want_kv[0].float(), **tol)
    torch.testing.assert_close(m.v_cache.float(), want_kv[1].float(), **tol)
    assert be.barrier.tolist() == [0, 0, 0]  # the counters left at zero, no barrier given up on


def test_one_row_decode_through_the_decoder_equals_the_cpu_engine() -> None:
    """Prefill, then one-row decode steps (the persistent kernel), against the float32 CPU engine;
    on a GPU in captured graphs too."""
    w = random_weights(NARROW, seed=4)
    ref = Decoder(NARROW, Shard(0, 1, NARROW), w, SingleRank(), max_slots=2, max_len=512, dtype="float32")
    m = Decoder(NARROW, Shard(0, 1, NARROW), w, SingleRank(), max_slots=2, max_len=512, dtype="float32",
                backend="cuda-persistent", device=DEV)
    assert m.status()["persistent"] is True
    n, one = 30, torch.ones(1, dtype=torch.int64)
    prompt = Step(torch.arange(n).view(1, n) % 11, torch.arange(n).view(1, n), one, one * n, one * n)
    torch.testing.assert_close(m.forward(prompt).float().cpu(), ref.forward(prompt), atol=1e-4, rtol=1e-4)
    tok = torch.tensor([[7]])
    for i in range(4):
        step = Step(tok, (one * (n + i)).view(1, 1), one, one, one * (n + i + 1), 2)
        want, got = ref.forward(step), m.forward(step).float().cpu()
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        tok = want.argmax(-1).view(1, 1)
    if DEV == "cuda":
        assert m.status()["graphs_captured"] >= 1


def test_models_it_does_not_fit_keep_the_five_kernels() -> None:
    qwen3 = dataclasses.replace(NARROW, arch="qwen3", qkv_bias=True, qk_norm=True)
    st = _model(torch.float32, qwen3).status()
    assert st["persistent"] is False and "q/k norm" in st["persistent_reason"]
    m = _model(torch.float32, NARROW)
    assert m.status()["persistent"] is True and "persistent_reason" not in m.status()
    wide = dataclasses.replace(m.dims, hidden=4096)
    assert "hidden 4096" in persistent.supported(wide, m.layers, 4096)
    assert "tensor parallel" in persistent.supported(dataclasses.replace(m.dims, tp=2), m.layers, 4096)


def test_every_stage_fits_the_launch() -> None:
    """No program owns two units of a stage (the kernel gives each program one), at SmolLM2's
    widths on an H200's 132 multiprocessors and on the interpreter's 16 programs."""
    m = _model(torch.float32)
    for programs in (16, 132):
        d = dataclasses.replace(m.dims, heads=9, kv_heads=3, head_dim=64, hidden=576)
        s = persistent.shape_for(d, 1536, programs)
        assert (9 + 2 * 3) * (32 // s.rq) <= programs
        assert 576 // s.ro <= programs and 1536 // s.rg <= programs and 576 // s.rd <= programs
        assert s.ro * s.hg * 64 <= persistent.TILE * s.warps and 2 * s.rg * s.bkg <= persistent.TILE * s.warps
