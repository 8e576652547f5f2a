"""--prefill-fp8 (backends/cuda/fp8.py): the activations' quantisation kernels, the FP8 matmul, the
routing of long prefills, the option's refusals, the start-up check, and the FP8 prefill's logits
against bf16's on SmolLM2's real weights.

Without a GPU the kernels run in Triton's interpreter and torch._scaled_mm on the CPU (torch 2.13
has a CPU kernel; where a build has none, those tests skip). Tolerances, stated rather than tuned:
an FP8 projection of random rows is ~4% off bf16's (relative norm; 3.6-3.9% on SmolLM2's real
layers: e4m3 keeps 3 mantissa bits, each factor within 2^-4). Through SmolLM2's 30 layers the last
position's logits were 0.11-0.33 x std from bf16's in RMS and at most 1.01 x std (a Zen 3 CPU, the
three chat prompts cut at 0, 3, 6 and 9 tokens from their ends; bf16 against float32: 0.055 and 0.15);
on an Ice Lake Xeon on one thread the third prompt cut at 3 came out 0.54-0.58 (0.20 on two threads:
the FP8 path's outputs differ by ~1e-6 with the thread count from the first layer, and 30 layers
amplify it). So the bounds are 0.8 and 2.0 x std, and the greedy token must agree wherever bf16's top-2 gap is
decisive (over 1.0 x std; FP8 moved such a gap by at most 0.55 x std). A wrong matmul does not pass:
with each o projection's scales applied to the wrong rows, the same three rows came out 1.2-1.6 x std
apart in RMS, none of the three greedy tokens the same.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from switchyard.engine.errors import ConfigError
from switchyard.engine.model.decoder import Decoder
from switchyard.engine.model.random_weights import SMOLLM2_135M, random_weights
from switchyard.engine.model.step import Step
from switchyard.engine.model.weights import Shard
from switchyard.engine.runner.comm import SingleRank
from switchyard.engine.runner.options import EngineOptions

pytest.importorskip("triton")
from switchyard.engine.backends.cuda import fp8  # noqa: E402  (after the skip: it imports triton)

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # kernels compiled on a GPU, interpreted without
# Triton's interpreter runs every program in Python: narrow widths (as test_cuda.py's NARROW), 16-aligned.
NARROW = dataclasses.replace(SMOLLM2_135M, vocab_size=1024, hidden_size=128, intermediate_size=256, num_heads=4,
                             num_kv_heads=2, head_dim=32, num_layers=2)
RMS_BOUND, MAX_BOUND, DECISIVE = 0.8, 2.0, 1.0  # x the bf16 logits' std (module docstring)


def _torch_prefill_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU, for time, the prefill's Triton kernels (RoPE, SiLU, the quantisations) become their
    torch equivalents: Triton's interpreter takes ~1 s a layer for a 40-token prompt's RoPE. The
    quantisations' codes are bit-identical (the kernel tests above); what a test then compares is
    the projections, bf16 or FP8 through _scaled_mm. On a GPU the kernels run compiled."""
    if DEV != "cpu":
        return
    from switchyard.engine.backends import attention, torch_ops
    from switchyard.engine.backends.cuda import prefill_kernels as pk

    def rope_split(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, heads: int,
                   kv_heads: int, head_dim: int, qk_norm: torch.Tensor | None,
                   eps: float, cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qn, kn = (None, None) if qk_norm is None else (qk_norm[:head_dim], qk_norm[head_dim:])
        q, k, v = torch_ops.rope_qkv(qkv, cos[pos], sin[pos], heads, kv_heads, head_dim, qn, kn, eps, qkv.dtype)
        if cache is not None:
            kc, vc, slots = cache
            live, bs = slots >= 0, kc.shape[-2]
            attention.write_kv(kc, vc, slots[live] // bs, slots[live] % bs, k[live], v[live],
                               attention.head_rows(kv_heads, bs, kc.device))
        return q, k, v

    def silu_mul_quant(gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = gu.float().chunk(2, dim=-1)
        return fp8.quant_reference(gate / (1 + torch.exp(-gate)) * up)

    monkeypatch.setattr(pk, "rope_split", rope_split)
    monkeypatch.setattr(pk, "silu_mul", torch_ops.silu_mul)
    monkeypatch.setattr(fp8, "quant_rows", fp8.quant_reference)
    monkeypatch.setattr(fp8, "silu_mul_quant", silu_mul_quant)


def _scaled_mm_runs_here(device: str) -> bool:
    one = torch.ones(16, 16, device=device).to(fp8.FP8)
    s = torch.ones(16, 1, device=device)
    try:
        torch._scaled_mm(one, one.t(), scale_a=s, scale_b=s.t().contiguous(), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True


needs_scaled_mm = pytest.mark.skipif(not _scaled_mm_runs_here(DEV), reason=f"torch._scaled_mm has no {DEV} kernel "
                                     "in this torch build")


# -- the quantisation kernels --------------------------------------------------------------------


@pytest.mark.parametrize("width", [1000, 576])  # ragged (not a power of two) and SmolLM2's hidden size
def test_quant_rows_equals_the_torch_reference(width: int) -> None:
    """Codes and scales equal torch's (quant_reference): normal rows, a row of zeros, one of tiny
    values, one with an outlier, from a strided view of a wider tensor."""
    g = torch.Generator().manual_seed(width)
    wide = torch.randn(9, width + 24, generator=g) * 3
    wide[2] = 0.0
    wide[4] = 1e-6 * wide[4]
    wide[6, 7] = 900.0  # one channel dominating its row (per-token scales exist for these)
    x = wide.to(DEV, torch.bfloat16)[:, :width]
    assert not x.is_contiguous()
    q, s = fp8.quant_rows(x)
    rq, rs = fp8.quant_reference(x)
    assert q.dtype == fp8.FP8 and q.shape == (9, width) and s.shape == (9, 1) and s.dtype == torch.float32
    # torch divides a CUDA tensor by a number as a multiply by its reciprocal (a last-bit difference
    # from the kernel's correctly rounded division); on the CPU both divide.
    assert torch.equal(s, rs) if DEV == "cpu" else torch.allclose(s, rs, rtol=2**-22, atol=0)
    if DEV == "cpu":
        assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    else:  # the GPU's cvt.rn.satfinite rounds to nearest even as torch does: expected equal, a step allowed
        off = int((q.float() != rq.float()).sum())
        print(f"\nquant_rows on the GPU: {off} of {q.numel()} codes differ from torch's")
        assert off <= q.numel() // 1000 and ((q.float() - rq.float()).abs() <= rq.float().abs() * 2**-3 + 2**-9).all()
    assert not q[2].float().any() and s[2].item() == pytest.approx(fp8.MIN_AMAX / fp8.FP8_MAX)
    assert q.float().abs().amax(-1)[[0, 1, 3, 6]].eq(fp8.FP8_MAX).all()  # each row's amax lands on 448
    deq = q.float() * s
    assert torch.allclose(deq, x.float(), rtol=2**-4, atol=float(s.max()) * 2**-9)


def test_silu_mul_quant_equals_silu_then_quant() -> None:
    """The SiLU kernel's FP8 output: SiLU(gate) * up in float32, quantised as quant_rows does (the
    kernel's exp and torch's may differ in the last bit: a code at most one step off)."""
    g = torch.Generator().manual_seed(7)
    gu = (torch.randn(11, 2 * 1000, generator=g) * 2).to(DEV, torch.bfloat16)
    gu[3] = 0.0
    q, s = fp8.silu_mul_quant(gu)
    gate, up = gu.float().chunk(2, dim=-1)
    rq, rs = fp8.quant_reference(gate / (1 + torch.exp(-gate)) * up)
    assert q.shape == (11, 1000) and torch.allclose(s, rs, rtol=1e-6)
    a, b = q.float(), rq.float()
    assert (a != b).float().mean() < 0.01
    assert ((a - b).abs() <= b.abs() * 2**-3 + 2**-9).all()


# -- the matmul ------------------------------------------------------------------------------------


@needs_scaled_mm
@pytest.mark.parametrize("bias", [False, True])
def test_fp8_projection_against_its_emulation_and_bf16(bias: bool) -> None:
    """Fp8Weight: _scaled_mm's row-wise product equals the dequantised product (to bf16's
    rounding of the output), and is within FP8's error of the bf16 projection."""
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(96, 208, generator=g) * 0.02).to(DEV, torch.bfloat16)
    b = (torch.randn(96, generator=g) * 0.1).to(DEV, torch.bfloat16) if bias else None
    x = torch.randn(37, 208, generator=g).to(DEV, torch.bfloat16)  # 37 rows: M need not be aligned
    w8 = fp8.Fp8Weight(w, b)
    assert w8.w.shape == (96, 208) and w8.scale.shape == (1, 96) and w8.scale.is_contiguous()
    y = w8(x)
    assert y.dtype == torch.bfloat16 and y.shape == (37, 96)
    qx, sx = fp8.quant_reference(x)
    emulated = (qx.float() * sx) @ (w8.w.float() * w8.scale.t()).t()
    if b is not None:
        emulated = emulated + b.float()
    assert torch.allclose(y.float(), emulated, rtol=2**-7, atol=1e-3)
    want = torch.nn.functional.linear(x, w, b).float()
    assert float((y.float() - want).norm() / want.norm()) < 0.06


def test_a_projection_that_does_not_suit_scaled_mm_keeps_bf16() -> None:
    cfg = dataclasses.replace(NARROW, intermediate_size=200)  # down's K = 200: not a multiple of 16
    m = Decoder(cfg, Shard(0, 1, cfg), random_weights(cfg, seed=1), SingleRank(), max_slots=2, max_len=64,
                dtype=torch.bfloat16, backend="cuda")
    fp8.attach(m.layers)
    layer = m.layers[0]
    assert layer.down.fp8 is None  # its input is the 200 wide
    assert layer.gate_up.fp8 is not None and layer.qkv.fp8 is not None and layer.o.fp8 is not None
    assert fp8.carried(m.layers)


# -- the option ------------------------------------------------------------------------------------


def test_the_option_is_refused_off_the_cuda_backend(tmp_path: Path) -> None:
    """Refused at start-up, not ignored: in the options (what the flags alone say), at load (what
    the device says), and by `engine serve` with exit code 2."""
    for kw in ({}, {"device": "cuda", "tp": 2}, {"device": "cuda", "decode_kernels": "torch"},
               {"device": "cuda", "dtype": "float32"}):
        with pytest.raises(ConfigError, match="--prefill-fp8 runs on the cuda backend only"):
            EngineOptions(model_path=Path("m"), prefill_fp8=True, **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--prefill-fp8"):
        EngineOptions.from_mapping({"model_path": "m", "prefill-fp8": True})
    ok = EngineOptions(model_path=Path("m"), device="cuda", prefill_fp8=True)
    assert ok.prefill_fp8 and ok.backend == "auto"
    w = random_weights(NARROW, seed=1)

    def load(backend: str) -> Decoder:
        return Decoder(NARROW, Shard(0, 1, NARROW), w, SingleRank(), max_slots=2, max_len=64, device=DEV,
                       dtype=torch.bfloat16, backend=backend, prefill_fp8=True)

    with pytest.raises(ConfigError, match="runs on the cuda backend, not torch"):
        load("torch")
    if DEV == "cpu":
        with pytest.raises(ConfigError, match="--prefill-fp8: FP8 matmuls need a CUDA GPU"):
            load("cuda")

    from typer.testing import CliRunner

    from switchyard.engine.serving.cli import engine_app

    r = CliRunner().invoke(engine_app, ["--model", str(tmp_path), "--prefill-fp8"], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "--prefill-fp8 runs on the cuda backend only" in r.output


def test_the_device_check_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "CUDA GPU" in fp8.unsupported(torch.device("cpu"), torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100")
    assert "sm89+" in fp8.unsupported(torch.device("cuda"), torch.bfloat16) and "sm80" in \
        fp8.unsupported(torch.device("cuda"), torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    assert fp8.unsupported(torch.device("cuda"), torch.bfloat16) == ""
    assert "float32" in fp8.unsupported(torch.device("cuda"), torch.float32)


def _narrow_fp8(seed: int = 2) -> Decoder:
    """A narrow cuda-backend decoder in bf16 with FP8 copies, as --prefill-fp8 makes one on a GPU
    (here also on a CPU, where the option itself is refused)."""
    m = Decoder(NARROW, Shard(0, 1, NARROW), random_weights(NARROW, seed=seed), SingleRank(), max_slots=2,
                max_len=64, device=DEV, dtype=torch.bfloat16, backend="cuda")
    fp8.attach(m.layers)
    m.prefill_fp8 = True
    return m


@needs_scaled_mm
def test_the_start_up_check_passes_and_catches_a_wrong_or_missing_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8.check on its own, and warmup's refusals: the FP8 check failing, or the cuda backend
    giving way to torch (the backend check itself, an 8-token prefill and a decode step through
    both backends, is test_cuda.py's; here it is stubbed, for time)."""
    from switchyard.engine.model import warmup

    m = _narrow_fp8()
    assert fp8.check(m.layers) == ""
    assert m.backend.name == "cuda" and m.status()["prefill_fp8"] is True
    assert m.status()["prefill_fp8_tokens"] == fp8.PREFILL_TOKENS
    monkeypatch.setattr(warmup, "check_backend", lambda *_a: "cuda backend's prefill check: a wrong kernel")
    with pytest.raises(ConfigError, match="--prefill-fp8 runs on the cuda backend, which gave way to torch: cuda "
                                          "backend's prefill check"):
        m.warmup()
    m = _narrow_fp8()
    monkeypatch.setattr(warmup, "check_backend", lambda *_a: "")

    good = m.layers[0].o.fp8.scale
    m.layers[0].o.fp8.scale = good.flip(-1).contiguous()  # each output row scaled by another's
    assert "FP8 o projection" in fp8.check(m.layers)
    m.layers[0].o.fp8.scale = good

    def missing(*_a: Any, **_k: Any) -> torch.Tensor:
        raise RuntimeError("Rowwise scaling is not currently supported on your device")

    monkeypatch.setattr(torch, "_scaled_mm", missing)
    assert "not currently supported" in fp8.check(m.layers)
    with pytest.raises(ConfigError, match="--prefill-fp8: FP8 qkv projection failed"):
        m.warmup()


@needs_scaled_mm
def test_long_prefills_and_only_they_run_on_the_fp8_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the threshold (moved to 12 tokens here) a prefill's four projections a layer run on
    their FP8 copies (the last layer's QKV only: past it, one row), the down projection's input
    quantised by the SiLU kernel; a shorter prefill
    keeps bf16 (bit-identical logits to a decoder without copies), and so does every decode step."""
    monkeypatch.setattr(fp8, "PREFILL_TOKENS", 12)
    _torch_prefill_kernels(monkeypatch)
    m, plain = _narrow_fp8(), Decoder(NARROW, Shard(0, 1, NARROW), random_weights(NARROW, seed=2), SingleRank(),
                                      max_slots=2, max_len=64, device=DEV, dtype=torch.bfloat16, backend="cuda")
    calls: list[int] = []
    mm = fp8.Fp8Weight.mm
    monkeypatch.setattr(fp8.Fp8Weight, "mm", lambda self, q, s: calls.append(q.shape[0]) or mm(self, q, s))
    silu_q = fp8.silu_mul_quant
    silu_rows: list[int] = []
    monkeypatch.setattr(fp8, "silu_mul_quant", lambda gu: silu_rows.append(gu.shape[0]) or silu_q(gu))
    g = torch.Generator().manual_seed(4)

    def prefill(model: Decoder, n: int) -> torch.Tensor:
        ids = torch.randint(0, NARROW.vocab_size, (1, n), generator=g)
        lens = torch.tensor([n])
        return model.forward(Step(ids, torch.arange(n).view(1, n), torch.tensor([0]), lens, lens, 0)).float().cpu()

    short = prefill(m, 11)
    g.manual_seed(4)
    assert torch.equal(short, prefill(plain, 11)) and not calls
    one = torch.ones(1, dtype=torch.int64)
    for rows in (1, 12, 24):  # a decode step never, however many rows (fused or not)
        assert not m.backend._fp8(m.backend.decode_plan(one.repeat(rows), one.repeat(rows) * 11,
                                                        one.repeat(rows) * 12, torch.zeros(rows, 4, dtype=torch.int64),
                                                        64, False))
    g.manual_seed(5)
    long = prefill(m, 12)
    # the last layer past its QKV runs on the prompt's last row only (backend.last_rows), in bf16
    assert calls == [12] * (4 * NARROW.num_layers - 3) and silu_rows == [12] * (NARROW.num_layers - 1)
    g.manual_seed(5)
    _assert_agree(_agreement(prefill(plain, 12), long))


# -- SmolLM2's real weights: FP8 prefill against bf16 ----------------------------------------------


def _agreement(bf16: torch.Tensor, f8: torch.Tensor) -> dict[str, Any]:
    """Per row: top-1 agreement, RMS and max |difference| in bf16's std, bf16's top-2 gap."""
    std = bf16.std(-1)
    top2 = bf16.topk(2, dim=-1).values
    return {"top1": (bf16.argmax(-1) == f8.argmax(-1)).tolist(),
            "rms": ((f8 - bf16).pow(2).mean(-1).sqrt() / std).tolist(),
            "max": ((f8 - bf16).abs().amax(-1) / std).tolist(), "gap": ((top2[:, 0] - top2[:, 1]) / std).tolist()}


def _assert_agree(a: dict[str, Any]) -> None:
    assert all(t for t, gap in zip(a["top1"], a["gap"], strict=True) if gap > DECISIVE), a
    assert max(a["rms"]) <= RMS_BOUND and max(a["max"]) <= MAX_BOUND, a


def _on_off(m: Decoder, step: Step, monkeypatch: pytest.MonkeyPatch, on_at: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same prefill with the FP8 copies off, then on (their threshold at `on_at` tokens)."""
    monkeypatch.setattr(fp8, "PREFILL_TOKENS", 1 << 62)
    off = m.forward(step).float().cpu()
    monkeypatch.setattr(fp8, "PREFILL_TOKENS", on_at)
    return off, m.forward(step).float().cpu()


def _prompts_step(prompts: list[list[int]]) -> Step:
    B, T = len(prompts), max(map(len, prompts))
    ids = torch.zeros(B, T, dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    lens = torch.tensor([len(p) for p in prompts])
    return Step(ids, torch.arange(T).expand(B, T).contiguous(), torch.arange(B), lens, lens, 0)


@needs_scaled_mm
@pytest.mark.usefixtures("one_thread")
def test_fp8_prefill_agrees_with_bf16_on_real_smollm2(smollm2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2's 30 real layers, its three chat prompts in one prefill (the FP8 threshold moved to
    1); on a CPU the prefill kernels' torch equivalents, on and off alike. Each prompt is cut 3
    tokens short, inside the chat template, where the next token is decisive (bf16's top-2 gaps
    1.96-2.87 x std; FP8 moved them by 0.01-0.55). At the prompts' ends the gaps are near ties
    (0.03-0.14 x std, one moved by 0.026 of its 0.033), which rounding alone may flip; with them
    and cuts of 6 and 9 tokens, 12 of 12 agreed."""
    cfg, w, _tok, prompts = smollm2
    prompts = [p[:-3] for p in prompts]
    _torch_prefill_kernels(monkeypatch)
    m = Decoder(cfg, Shard(0, 1, cfg), w, SingleRank(), max_slots=len(prompts), max_len=256, device=DEV,
                dtype=torch.bfloat16, backend="cuda")
    fp8.attach(m.layers)
    assert fp8.check(m.layers) == ""
    off, on = _on_off(m, _prompts_step(prompts), monkeypatch, 1)
    a = _agreement(off, on)
    print(f"\nSmolLM2 FP8 prefill vs bf16 ({DEV}): {a}")
    _assert_agree(a)
    assert all(a["top1"])


# -- GPU ---------------------------------------------------------------------------------------------


def _long_prompts(vocab: int, n: int, rows: int, seed: int) -> Step:
    g = torch.Generator().manual_seed(seed)
    return _prompts_step([torch.randint(3, vocab, (n,), generator=g).tolist() for _ in range(rows)])


@gpu
def test_gpu_fp8_prefill_of_4k_tokens_agrees_with_bf16_on_real_smollm2(smollm2: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Two prompts of 4,160 tokens (SmolLM2's chat prompts repeated: text, not noise) through the
    compiled kernels at the served threshold. Needs SmolLM2's GGUF, which cannot travel to a
    device run (98 MB): there the test beside this one runs random weights of its shape."""
    cfg, w, _tok, prompts = smollm2
    text = [t for p in prompts for t in p]
    rows = [(text * 200)[i * 7: i * 7 + 4160] for i in range(2)]
    m = Decoder(cfg, Shard(0, 1, cfg), w, SingleRank(), max_slots=2, max_len=4352, device="cuda",
                backend="cuda", prefill_fp8=True)
    off, on = _on_off(m, _prompts_step(rows), monkeypatch, 4096)
    a = _agreement(off, on)
    print(f"\nSmolLM2 FP8 prefill vs bf16, 2 x 4160 tokens: {a}")
    _assert_agree(a)


@gpu
def test_gpu_fp8_prefill_of_4k_tokens_agrees_with_bf16_on_smollm2_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on random weights of SmolLM2's shape (30 layers): every GPU run has these."""
    cfg = SMOLLM2_135M
    m = Decoder(cfg, Shard(0, 1, cfg), random_weights(cfg, seed=8, device="cuda"), SingleRank(), max_slots=2,
                max_len=4352, device="cuda", backend="cuda", prefill_fp8=True)
    m.warmup()
    assert m.status()["prefill_fp8"] is True and m.backend.name == "cuda"
    off, on = _on_off(m, _long_prompts(cfg.vocab_size, 4160, 2, seed=9), monkeypatch, fp8.PREFILL_TOKENS)
    a = _agreement(off, on)
    print(f"\nSmolLM2-shaped random weights, FP8 prefill vs bf16, 2 x 4160 tokens: {a}")
    _assert_agree(a)


@pytest.fixture(scope="module")
def fp8_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (CI has none)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from engine_support import EngineServer
    from test_cuda_serve import write_random_model

    d = tmp_path_factory.mktemp("fp8-smollm2")
    write_random_model(d, dataclasses.replace(SMOLLM2_135M, num_layers=4), seed=12, max_positions=8192)
    s = EngineServer(d, d / "engine.log", standalone=True,
                     extra=["--device", "cuda", "--prefill-fp8", "--max-model-len", "8192", "--max-num-seqs", "4"])
    yield s
    s.close()


@gpu
def test_gpu_served_engine_with_prefill_fp8(fp8_server: Any) -> None:
    """`engine serve --device cuda --prefill-fp8`: /health says so, and a 4,200-token prompt (an
    FP8 prefill) and a short one (bf16) are answered."""
    import httpx
    from engine_support import get

    status, h = get(fp8_server.url + "/health")
    assert status == 200 and h["device"]["prefill_fp8"] is True and h["device"]["backend"] == "cuda"
    assert h["device"]["prefill_fp8_tokens"] == fp8.PREFILL_TOKENS
    g = torch.Generator().manual_seed(13)
    for n in (4200, 40):
        ids = torch.randint(3, SMOLLM2_135M.vocab_size, (n,), generator=g).tolist()
        r = httpx.post(fp8_server.url + "/v1/completions", timeout=120,
                       json={"model": "m", "prompt": ids, "max_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["prompt_tokens"] == n and body["usage"]["completion_tokens"] == 4
