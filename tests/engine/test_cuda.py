"""The decoder on its GPU backends (torch, cuda: model/decoder.py with backends/torch_backend.py,
backends/cuda/) against the CPU engine (the same decoder on the cpu backend).

CPU tests run everywhere: the GPU backends' code path (slot-space decode in model/graph_runner.py,
spare KV block, buckets, fused ops, graph wrapper) executed eagerly on CPU. GPU tests need CUDA and skip
without it (CI has no GPU); they were run on one H200 through the device tool.

Tolerance (stated, not tuned per run): the bf16 model's logits may differ from the float32
CPU engine's by at most 15% of the reference logits' standard deviation (observed: ~5%), and
the greedy token must agree wherever the reference's top-2 gap exceeds twice that bound.
Graphs on vs off: on runs the compiled (fused) ops inside the graph, off runs plain torch ops,
so they agree only within the same bound (seen on an H200: 0.045 x std apart, 0.0625 x std from
the CPU engine); with the same ops, replaying a graph gave bit-identical logits (seen: 0.0).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from switchyard.engine.backends.cuda.graphs import BATCH_BUCKETS, DecodeGraphs, batch_bucket, len_bucket
from switchyard.engine.backends.torch_ops import Fused, Ops, silu_mul
from switchyard.engine.model.decoder import Decoder
from switchyard.engine.model.random_weights import SMOLLM2_135M, random_weights
from switchyard.engine.model.step import Step
from switchyard.engine.model.weights import Shard
from switchyard.engine.runner.comm import SingleRank

REL_TOL = 0.15
pytestmark = pytest.mark.usefixtures("one_thread")  # whole models in this process (conftest.one_thread)
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")

# CPU tests: SmolLM2's widths, 4 layers (every layer runs the same code; 30 would only cost time).
SMALL = dataclasses.replace(SMOLLM2_135M, num_layers=4)


def scenario(models: list, vocab: int, seed: int = 0, decode_steps: int = 4,
             follow: list[torch.Tensor] | None = None) -> list[list[torch.Tensor]]:
    """Drive every model through the same steps, greedy on models[0]'s logits (teacher forcing),
    or on `follow`'s (an earlier run's, so that two runs see the same tokens even where bf16
    near-ties would pick differently): a right-padded prefill into slots 0, 2, 5; decode; slot 2
    finishes; a new one-token prompt joins in slot 1 (the decode path); decode again. Returns
    each model's logits per step."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([7, 12, 3])
    T = int(lens.max())
    ids = torch.zeros(3, T, dtype=torch.int64)
    for i, n in enumerate(lens.tolist()):
        ids[i, :n] = torch.randint(0, vocab, (n,), generator=g)
    out: list[list[torch.Tensor]] = [[] for _ in models]

    def step(*args: object) -> torch.Tensor:
        for k, m in enumerate(models):
            out[k].append(m.forward(Step(*args)).float().cpu())
        return out[0][-1] if follow is None else follow[len(out[0]) - 1]

    positions = torch.arange(T).expand(3, T).contiguous()
    slots = torch.tensor([0, 2, 5])
    logits = step(ids, positions, slots, lens, lens, 0)
    ctx = lens.clone()
    one = torch.ones(3, dtype=torch.int64)
    for _ in range(decode_steps):
        nxt = logits.argmax(-1).view(-1, 1)
        logits = step(nxt, ctx.view(-1, 1).clone(), slots, one[: len(slots)], ctx + 1, int(slots.max()) + 1)
        ctx = ctx + 1
    keep = torch.tensor([0, 2])  # the sequence in slot 2 finished
    slots, ctx, last = slots[keep], ctx[keep], logits[keep].argmax(-1)
    newcomer = torch.randint(0, vocab, (1, 1), generator=g)
    first = step(newcomer, torch.zeros(1, 1, dtype=torch.int64), torch.tensor([1]), one[:1], one[:1], 6)
    slots = torch.tensor([0, 1, 5])
    nxt = torch.stack([last[0], first[0].argmax(), last[1]]).view(-1, 1)
    ctx = torch.stack([ctx[0], torch.tensor(1), ctx[1]])
    for _ in range(decode_steps):
        logits = step(nxt, ctx.view(-1, 1).clone(), slots, one, ctx + 1, 6)
        nxt, ctx = logits.argmax(-1).view(-1, 1), ctx + 1
    return out


def assert_close_to_reference(ref: list[torch.Tensor], got: list[torch.Tensor], rel: float) -> float:
    """Max |difference| / std(reference) over all steps; greedy agreement where it is decisive."""
    worst = 0.0
    for a, b in zip(ref, got, strict=True):
        assert a.shape == b.shape
        assert torch.isfinite(b).all()
        std = float(a.std())
        diff = float((a - b).abs().max())
        worst = max(worst, diff / std)
        top2 = a.topk(2, dim=-1).values
        decisive = (top2[:, 0] - top2[:, 1]) > 2 * rel * std
        assert torch.equal(a.argmax(-1)[decisive], b.argmax(-1)[decisive])
    assert worst <= rel, f"max |logit diff| = {worst:.4f} x std, over the {rel} bound"
    return worst


@pytest.fixture(scope="module")
def small_weights() -> dict[str, torch.Tensor]:
    return random_weights(SMALL, seed=1)


def _pair(cfg, w, dtype, device="cpu", backend="torch", **kw):  # type: ignore[no-untyped-def]
    """The CPU engine (cpu backend, float32) and the decoder on a GPU backend (torch, cuda)."""
    sh = Shard(0, 1, cfg)
    ref = Decoder(cfg, sh, w, SingleRank(), max_slots=8, max_len=64, dtype="float32")
    return ref, Decoder(cfg, sh, w, SingleRank(), max_slots=8, max_len=64, device=device, dtype=dtype,
                        backend=backend, **kw)


def test_cpu_float32_equals_cpu_engine(small_weights: dict[str, torch.Tensor]) -> None:
    ref, m = _pair(SMALL, small_weights, torch.float32, cuda_graphs=True)
    out = scenario([ref, m], SMALL.vocab_size)
    worst = assert_close_to_reference(out[0], out[1], 1e-4)
    assert worst < 1e-4
    assert m.status()["cuda_graphs"] is False and m.status()["graphs_captured"] == 0  # no GPU: eager


def test_cpu_bfloat16_within_tolerance(small_weights: dict[str, torch.Tensor]) -> None:
    ref, m = _pair(SMALL, small_weights, torch.bfloat16)
    m = m.view("torch", max_slots=8, graph_parts=3)  # the step split into parts runs the same computation
    out = scenario([ref, m], SMALL.vocab_size)
    assert_close_to_reference(out[0], out[1], REL_TOL)


def test_cpu_attention_and_kv_write_variants(small_weights: dict[str, torch.Tensor]) -> None:
    """The benches' variant backend (bench/engine_cuda_variants.py): K/V by advanced indexing,
    decode attention through SDPA."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import engine_cuda_variants

    ref, m = _pair(SMALL, small_weights, torch.float32, backend=engine_cuda_variants.IndexSdpaBackend.name)
    out = scenario([ref, m], SMALL.vocab_size, decode_steps=2)
    assert_close_to_reference(out[0], out[1], 1e-4)


fused = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (dev extra)")
# The fused tests run the kernels where they can: interpreted on a CPU machine, compiled on a GPU
# one (a Triton kernel compiled for the GPU cannot read CPU tensors).
FUSED_DEV = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's interpreter runs every program of a launch in Python: narrow widths keep it to seconds
# (the widths change no code path: the launchers size their grids from them).
NARROW = dataclasses.replace(SMALL, vocab_size=1024, hidden_size=128, intermediate_size=256, num_heads=4,
                             num_kv_heads=2, head_dim=32, num_layers=2)


@fused
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, REL_TOL)])
def test_fused_kernels_equal_cpu_engine(dtype: torch.dtype, tol: float) -> None:
    """The Triton decode layer (interpreted without a GPU), prefills, joins, idle slots and all."""
    ref, m = _pair(NARROW, random_weights(NARROW, seed=2), dtype, FUSED_DEV, backend="cuda")
    assert m.backend.name == "cuda"
    out = scenario([ref, m], NARROW.vocab_size, decode_steps=3)
    assert_close_to_reference(out[0], out[1], tol)


@fused
def test_a_prefills_kv_write_in_its_rope_kernel_is_the_torch_backends() -> None:
    """CudaBackend.PREFILL_GLUE: rope_split writing the keys and values at each row's slot (padding's
    -1 skipped) and the Triton add + norm leave the same cache and logits as the torch backend's
    gathers and index copies, for right-padded prompts and prompts continued after cached starts."""
    w, g = random_weights(NARROW, seed=3), torch.Generator().manual_seed(5)
    ids, lens = torch.randint(0, NARROW.vocab_size, (2, 10), generator=g), torch.tensor([10, 7])
    more, lens2 = torch.randint(0, NARROW.vocab_size, (2, 3), generator=g), torch.tensor([3, 2])
    got = []
    for glue in (True, False):
        m = Decoder(NARROW, Shard(0, 1, NARROW), w, SingleRank(), max_slots=4, max_len=64, device=FUSED_DEV,
                    backend="cuda", dtype="float32")
        m.backend.PREFILL_GLUE = glue  # type: ignore[attr-defined]
        logits = [m.forward(Step(ids, torch.arange(10).expand(2, 10).contiguous(), torch.tensor([0, 1]), lens, lens)),
                  m.forward(Step(more, torch.stack([torch.arange(10, 13), torch.arange(7, 10)]), torch.tensor([0, 1]),
                                 lens2, lens + lens2))]
        got.append((logits, m.k_cache.clone(), m.v_cache.clone()))  # type: ignore[union-attr]
    (a, ka, va), (b, kb, vb) = got
    torch.testing.assert_close(ka, kb, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(va, vb, atol=1e-6, rtol=1e-5)
    assert bool(ka.abs().sum() > 0)
    assert assert_close_to_reference(b, a, 1e-5) < 1e-5


@fused
def test_fused_kernels_pass_their_start_up_check_or_give_way(monkeypatch: pytest.MonkeyPatch) -> None:
    from switchyard.engine.backends.cuda import kernels as cuda_kernels

    w = random_weights(NARROW, seed=2)
    sh = Shard(0, 1, NARROW)
    m = Decoder(NARROW, sh, w, SingleRank(), max_slots=2, max_len=64, device=FUSED_DEV, backend="cuda")
    m.warmup()
    assert m.status()["decode_kernels"] == "fused" and "decode_kernels_reason" not in m.status()

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no kernel image for this device")

    good_gate_up = cuda_kernels.gate_up_silu
    monkeypatch.setattr(cuda_kernels, "gate_up_silu", broken)
    m = Decoder(NARROW, sh, w, SingleRank(), max_slots=2, max_len=64, device=FUSED_DEV, backend="cuda")
    m.warmup()
    st = m.status()
    assert st["decode_kernels"] == "torch" and "no kernel image" in st["decode_kernels_reason"]
    assert m.backend.name == "torch"
    # A kernel wrong only past one row (the tl.dot variant): the check's two-row step catches it
    good = cuda_kernels.gemv_residual

    def wrong_past_one_row(a: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        out = good(a, *args, **kwargs)  # type: ignore[arg-type]
        return out if a.shape[0] == 1 else out * 3

    monkeypatch.setattr(cuda_kernels, "gate_up_silu", good_gate_up)
    monkeypatch.setattr(cuda_kernels, "gemv_residual", wrong_past_one_row)
    m = Decoder(NARROW, sh, w, SingleRank(), max_slots=2, max_len=64, device=FUSED_DEV, backend="cuda")
    m.warmup()
    assert "two-row decode check" in m.status()["decode_kernels_reason"] and m.backend.name == "torch"
    tp2 = Decoder(NARROW, Shard(0, 2, NARROW), w, SingleRank(), max_slots=2, max_len=64, device=FUSED_DEV,
                  backend="cuda")
    assert tp2.backend.name == "torch" and "one rank" in tp2.status()["decode_kernels_reason"]


def test_a_wide_model_runs_the_fused_layers_at_one_row_only() -> None:
    """The threshold the H200 sweep chose (bench/results/gpu_b64/call4): the 8B shape's steps of
    2-16 rows are faster on cuBLAS with rope_write, SmolLM2's on the fused layers."""
    from switchyard.engine.backends.cuda.backend import MAX_FUSED_ROWS, fused_rows

    assert fused_rows(4096) == 1 and fused_rows(8192) == 1
    assert fused_rows(576) == MAX_FUSED_ROWS == 16 and fused_rows(NARROW.hidden_size) == 16


@fused
def test_steps_past_the_fused_rows_read_the_cache_with_the_paged_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past 16 rows the projections are cuBLAS's and attention the paged kernel: made to happen
    at 3 rows here (the fused limit set to 2), prefills, joins, idle slots and all."""
    from switchyard.engine.backends.cuda import backend as cuda_backend

    monkeypatch.setattr(cuda_backend, "MAX_FUSED_ROWS", 2)
    ref, m = _pair(NARROW, random_weights(NARROW, seed=5), torch.float32, FUSED_DEV, backend="cuda")
    out = scenario([ref, m], NARROW.vocab_size, decode_steps=3)
    assert_close_to_reference(out[0], out[1], 1e-4)


@fused
def test_a_decode_step_of_many_rows_equals_cpu_engine() -> None:
    """24 rows (past the fused layers' 16): cuBLAS's projections, kernels.rope_write and the paged
    attention over a launch of many rows, two decode steps after a prefill, against the CPU engine
    (the split rule at more rows: test_cuda_kernels.py)."""
    w = random_weights(NARROW, seed=6)
    sh = Shard(0, 1, NARROW)
    models = [Decoder(NARROW, sh, w, SingleRank(), max_slots=24, max_len=64, dtype="float32"),
              Decoder(NARROW, sh, w, SingleRank(), max_slots=24, max_len=64, device=FUSED_DEV, dtype=torch.float32,
                      backend="cuda")]
    B, n = 24, 5
    ids = torch.randint(0, NARROW.vocab_size, (B, n), generator=torch.Generator().manual_seed(6))
    lens, slots, one = torch.full((B,), n), torch.arange(B), torch.ones(B, dtype=torch.int64)
    logits = [m.forward(Step(ids, torch.arange(n).expand(B, n).contiguous(), slots, lens, lens, 0)).float().cpu()
              for m in models]
    for ctx in range(n, n + 2):
        nxt = logits[0].argmax(-1).view(-1, 1)
        logits = [m.forward(Step(nxt, torch.full((B, 1), ctx), slots, one, torch.full((B,), ctx + 1), B)).float().cpu()
                  for m in models]
        assert_close_to_reference([logits[0]], [logits[1]], 1e-4)


def test_backend_auto_is_fused_on_a_gpu_and_ours_on_a_cpu() -> None:
    from switchyard.engine.backends import registry
    from switchyard.engine.runner.options import EngineOptions

    w = random_weights(NARROW, seed=2)
    m = Decoder(NARROW, Shard(0, 1, NARROW), w, SingleRank(), max_slots=2, max_len=64, device="cpu")
    assert m.backend.name == "cpu" and m.status() == {"device": "cpu", "backend": "cpu"}
    m = Decoder(NARROW, Shard(0, 1, NARROW), w, SingleRank(), max_slots=2, max_len=64, device="cpu", backend="torch")
    assert m.status()["decode_kernels"] == "torch" and m.status()["prefill_kernels"] == "torch"
    if torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
        m = Decoder(NARROW, Shard(0, 1, NARROW), w, SingleRank(), max_slots=2, max_len=64, device="cuda")
        m.warmup()
        assert m.status()["decode_kernels"] == "fused" and m.status()["prefill_kernels"] == "fused"
    with pytest.raises(ValueError, match="auto"):
        Decoder(NARROW, Shard(0, 1, NARROW), w, SingleRank(), max_slots=2, max_len=64, device="cpu", backend="triton")
    # --decode-kernels, as `engine serve --device cuda` takes it, names a backend
    opts = {k: EngineOptions(model_path=Path("m"), device="cuda", decode_kernels=k).backend
            for k in ("auto", "fused", "torch")}
    assert opts == {"auto": "auto", "fused": "cuda", "torch": "torch"}
    assert EngineOptions(model_path=Path("m"), decode_kernels="fused").backend == "cpu"
    assert registry.resolve("auto", "cpu", 1) == ("cpu", "")
    assert registry.resolve("torch", "cuda", 2) == ("torch", "")


@fused
def test_fused_kernels_qwen3_bias_and_qk_norm() -> None:
    cfg = dataclasses.replace(NARROW, arch="qwen3", qkv_bias=True, qk_norm=True)
    w = random_weights(cfg, seed=3)
    ref, m = _pair(cfg, w, torch.float32, FUSED_DEV, backend="cuda")
    out = scenario([ref, m], cfg.vocab_size, decode_steps=2)
    assert_close_to_reference(out[0], out[1], 1e-4)


def test_cpu_qwen3_bias_and_qk_norm() -> None:
    cfg = dataclasses.replace(SMALL, arch="qwen3", qkv_bias=True, qk_norm=True, num_layers=2)
    w = random_weights(cfg, seed=3)
    ref, m = _pair(cfg, w, torch.float32)
    out = scenario([ref, m], cfg.vocab_size, decode_steps=2)
    assert_close_to_reference(out[0], out[1], 1e-4)


def test_idle_slots_write_only_the_spare_block(small_weights: dict[str, torch.Tensor]) -> None:
    """A decode step covering slots 0..S-1 must not touch any block but its live rows' and the
    spare one (where the slots outside the step write)."""
    _, m = _pair(SMALL, small_weights, torch.float32)
    ids = torch.randint(0, SMALL.vocab_size, (2, 5))
    lens = torch.tensor([5, 5])
    m.forward(Step(ids, torch.arange(5).expand(2, 5).contiguous(), torch.tensor([0, 1]), lens, lens, 0))
    before = m.k_cache.clone()  # type: ignore[union-attr]
    m.forward(Step(torch.tensor([[3]]), torch.tensor([[5]]), torch.tensor([0]), torch.tensor([1]), torch.tensor([6]), 2))
    changed = (m.k_cache != before).flatten(2).any(-1).any(0)  # type: ignore[union-attr]
    assert changed.nonzero().view(-1).tolist() == [0, m.num_blocks]  # slot 0's first block, the spare
    assert m.k_cache[:, 0, :, 5].abs().sum() > 0  # type: ignore[index]


def _paged_prefix(w: dict[str, torch.Tensor], cfg, device: str, dtype: torch.dtype,  # type: ignore[no-untyped-def]
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor], Decoder]:
    """A prompt in scattered blocks of a 12-block pool; a second that shares its first two
    blocks (a cached prefix) and prefills only its last 7 tokens (the masked path over gathered
    blocks); then both decode, crossing into new blocks. The CPU engine and the GPU model get
    the same tables; returns both's logits per step and the GPU model."""
    sh = Shard(0, 1, cfg)
    ref = Decoder(cfg, sh, w, SingleRank(), max_slots=2, max_len=64, num_blocks=12, dtype="float32")
    m = Decoder(cfg, sh, w, SingleRank(), max_slots=2, max_len=64, device=device, dtype=dtype, num_blocks=12,
                backend="torch")
    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, cfg.vocab_size, (40,), generator=g)
    b = torch.cat((a[:32], torch.randint(0, cfg.vocab_size, (7,), generator=g)))
    tables = torch.tensor([[7, 2, 11, 3], [7, 2, 5, 9]])
    one = torch.ones(2, dtype=torch.int64)
    steps = [(a.view(1, 40), torch.arange(40).view(1, 40), torch.tensor([0]), torch.tensor([40]), torch.tensor([40]), 0,
              tables[:1]),
             (b[32:].view(1, 7), torch.arange(32, 39).view(1, 7), torch.tensor([1]), torch.tensor([7]),
              torch.tensor([39]), 0, tables[1:])]
    out: list[list[torch.Tensor]] = [[model.forward(Step(*st)).float().cpu() for st in steps] for model in (ref, m)]
    ctx = torch.tensor([40, 39])
    nxt = torch.stack([out[0][0][0].argmax(), out[0][1][0].argmax()]).view(2, 1)
    for _ in range(10):  # the reference's tokens for both
        step = (nxt, ctx.view(2, 1).clone(), torch.tensor([0, 1]), one, ctx + 1, 2, tables)
        out[0].append(ref.forward(Step(*step)))
        out[1].append(m.forward(Step(*step)).float().cpu())
        nxt, ctx = out[0][-1].argmax(-1).view(2, 1), ctx + 1
    return out[0], out[1], m


def test_cpu_paged_blocks_and_a_cached_prefix_equal_cpu_engine(small_weights: dict[str, torch.Tensor]) -> None:
    ref, got, _ = _paged_prefix(small_weights, SMALL, "cpu", torch.float32)
    assert assert_close_to_reference(ref, got, 1e-4) < 1e-4


@gpu
def test_gpu_paged_blocks_and_a_cached_prefix_match_cpu_engine() -> None:
    """The same on a GPU: bf16, decode steps captured and replayed as CUDA graphs."""
    cfg = dataclasses.replace(SMOLLM2_135M, num_layers=8)
    ref, got, m = _paged_prefix(random_weights(cfg, seed=6), cfg, "cuda", torch.bfloat16)
    worst = assert_close_to_reference(ref, got, REL_TOL)
    print(f"\nGPU paged bf16 vs CPU fp32: {worst:.4f} x std; {m.status()}")
    assert m.status()["graphs_captured"] >= 1


@pytest.mark.parametrize("backend,dtype", [("torch", "float32"), ("cpu", "float32"), ("cpu", "int4")])
def test_a_prefills_last_layer_runs_on_each_prompts_last_row(small_weights: dict[str, torch.Tensor], backend: str,
                                                             dtype: str) -> None:
    """backend.last_rows: past its KV write, a prefill's last layer runs on each prompt's last row
    only; the logits are those of every row through it, for right-padded prompts from position 0
    and for two prompts continued after cached starts of different lengths (a mask row each). On
    the cpu backend in float32 (torch's ops) and int4 (the native fused layers, where they build)."""
    def run(narrow: bool) -> tuple[list[torch.Tensor], int]:
        m = Decoder(SMALL, Shard(0, 1, SMALL), small_weights, SingleRank(), max_slots=4, max_len=64,
                    dtype=dtype, backend=backend)
        calls = []
        last_rows = m.backend.last_rows

        def spy(q, x, p):  # type: ignore[no-untyped-def]
            out = last_rows(q, x, p) if narrow else None
            calls.append(out is not None and out[1].shape[0] == p.B)
            return out

        m.backend.last_rows = spy  # type: ignore[method-assign]
        g = torch.Generator().manual_seed(4)
        ids, lens = torch.randint(0, SMALL.vocab_size, (2, 20), generator=g), torch.tensor([20, 13])
        more, lens2 = torch.randint(0, SMALL.vocab_size, (2, 6), generator=g), torch.tensor([6, 4])
        pos2 = torch.stack([torch.arange(20, 26), torch.arange(13, 19)])
        logits = [m.forward(Step(ids, torch.arange(20).expand(2, 20).contiguous(), torch.tensor([0, 1]), lens, lens)),
                  m.forward(Step(more, pos2, torch.tensor([0, 1]), lens2, lens + lens2))]
        return logits, sum(calls)

    ref, none = run(False)
    got, narrowed = run(True)
    assert none == 0 and narrowed == 2  # each step's last layer, on its two rows
    assert assert_close_to_reference(ref, got, 1e-4) < 1e-4


def test_buckets() -> None:
    assert [batch_bucket(n, 256) for n in (1, 3, 5, 17, 33, 200, 256)] == [1, 4, 8, 24, 48, 224, 256]
    assert batch_bucket(300, 256) == 256 and batch_bucket(5, 6) == 6
    assert all(a < b for a, b in zip(BATCH_BUCKETS, BATCH_BUCKETS[1:], strict=False))
    assert [len_bucket(n, 8192) for n in (1, 256, 257, 3000)] == [256, 256, 512, 4096]
    assert len_bucket(5000, 2048) == 2048


def test_graph_wrapper_runs_eagerly_without_cuda() -> None:
    calls: list[tuple[int, int, int]] = []

    def step(b: int, s: int) -> Iterator[None]:  # two parts, as a model with graph_parts=2 yields
        calls.append((b, s, 0))
        yield
        calls.append((b, s, 1))

    g = DecodeGraphs(step, torch.device("cpu"), enabled=True)
    g.run(4, 256)
    g.run(4, 256)
    assert calls == [(4, 256, 0), (4, 256, 1)] * 2 and not g.enabled and not g.graphs


def test_fused_op_falls_back_to_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_a: object, **_k: object):  # type: ignore[no-untyped-def]
        def fail(*_x: object) -> None:
            raise RuntimeError("no compiler here")
        return fail

    monkeypatch.setattr(torch, "compile", broken)
    f = Fused(silu_mul, enabled=True)
    x = torch.randn(3, 8)
    assert torch.equal(f(x), silu_mul(x))
    assert f.compiled is None and "no compiler here" in f.error
    assert Ops(torch.device("cpu")).status() == {"add_rms": "eager", "rope_qkv": "eager", "silu_mul": "eager"}


# -- GPU ------------------------------------------------------------------------------------


@gpu
def test_gpu_matches_cpu_engine_with_and_without_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    from switchyard.engine.model import graph_runner

    # Several graphs a step, replayed in order (served: one, GRAPH_PARTS; the other GPU tests run that).
    monkeypatch.setattr(graph_runner, "GRAPH_PARTS", 4)
    cfg = SMOLLM2_135M  # the full shape: 30 layers
    w = random_weights(cfg, seed=2)
    sh = Shard(0, 1, cfg)
    ref = Decoder(cfg, sh, w, SingleRank(), max_slots=8, max_len=256, dtype="float32")
    on = Decoder(cfg, sh, w, SingleRank(), max_slots=8, max_len=256, device="cuda", cuda_graphs=True, backend="torch")
    off = Decoder(cfg, sh, w, SingleRank(), max_slots=8, max_len=256, device="cuda", cuda_graphs=False,
                  backend="torch")
    assert on.graph_runner.parts == 4  # type: ignore[union-attr]
    out = scenario([ref, on, off], cfg.vocab_size, decode_steps=6)
    w_on = assert_close_to_reference(out[0], out[1], REL_TOL)
    w_off = assert_close_to_reference(out[0], out[2], REL_TOL)
    std = float(torch.cat(out[0]).std())
    gdiff = max(float((a - b).abs().max()) for a, b in zip(out[1], out[2], strict=True))
    print(f"\nGPU bf16 vs CPU fp32: graphs on {w_on:.4f} x std, off {w_off:.4f} x std; "
          f"on vs off max diff {gdiff:.2e}; {on.status()}")
    assert gdiff <= REL_TOL * std
    assert on.status()["graphs_captured"] >= 1  # bucket (8 slots, span 256)
    assert on.graph_runner.graphs.enabled and not off.graph_runner.graphs.enabled  # type: ignore[union-attr]


@gpu
def test_gpu_fused_ops_compile() -> None:
    cfg = dataclasses.replace(SMOLLM2_135M, num_layers=2)
    w = random_weights(cfg, seed=4, device="cuda")
    m = Decoder(cfg, Shard(0, 1, cfg), w, SingleRank(), max_slots=4, max_len=256, device="cuda", backend="torch")
    lens = torch.tensor([9])
    m.forward(Step(torch.randint(0, cfg.vocab_size, (1, 9)), torch.arange(9).view(1, 9), torch.tensor([0]), lens, lens, 0))
    m.forward(Step(torch.tensor([[5]]), torch.tensor([[9]]), torch.tensor([0]), torch.tensor([1]), torch.tensor([10]), 1))
    assert m.status()["fused_ops"] == {"add_rms": "compiled", "rope_qkv": "compiled", "silu_mul": "compiled"}


def test_inverse_cdf_sampling_matches_the_distribution() -> None:
    from switchyard.engine.core.sampling import inverse_cdf

    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    g = torch.Generator().manual_seed(7)
    draws = torch.cat([inverse_cdf(probs, torch.rand(1, generator=g, dtype=torch.float64)) for _ in range(4000)])
    freq = torch.bincount(draws, minlength=4).double() / 4000
    assert freq[1] == 0  # a zero-probability token is never drawn
    assert torch.allclose(freq, probs.double(), atol=0.03), freq


def _random_llama_dir(d, cfg) -> None:  # type: ignore[no-untyped-def]
    import json

    from safetensors.torch import save_file

    w = random_weights(cfg, seed=5)
    save_file({("lm_head.weight" if k == "lm_head.weight" else f"model.{k}"): v.contiguous() for k, v in w.items()},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta, "max_position_embeddings": 2048,
        "tie_word_embeddings": cfg.tie_embeddings, "eos_token_id": 2, "bos_token_id": 1}))


@gpu
def test_gpu_runner_and_sampling(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The runner with --device cuda (what `engine serve --device cuda` runs) against the CPU runner
    on the same safetensors file; seeded sampling on the GPU logits is reproducible."""
    from switchyard.engine.core.sampling import SamplingParams, make_generator, sample
    from switchyard.engine.runner.model_runner import Runner
    from switchyard.engine.runner.options import EngineOptions

    _random_llama_dir(tmp_path, SMALL)
    runners = []
    for device in ("cpu", "cuda"):
        r = Runner(EngineOptions(model_path=tmp_path, device=device, max_num_seqs=8, max_model_len=256,
                                 dtype="float32" if device == "cpu" else "auto"), 0, 1)
        r.setup()
        runners.append(r)
    cpu, gpu_runner = runners
    assert isinstance(gpu_runner.model, Decoder) and gpu_runner.dtype == "bfloat16"

    class AsModel:
        def __init__(self, r: Runner) -> None:
            self.r = r

        def forward(self, step: Step) -> torch.Tensor:
            return self.r.step(step)

    out = scenario([AsModel(cpu), AsModel(gpu_runner)], SMALL.vocab_size, decode_steps=3)
    assert_close_to_reference(out[0], out[1], REL_TOL)
    assert gpu_runner.model.status()["graphs_captured"] >= 1
    logits = gpu_runner.step(Step(torch.tensor([[5]]), torch.tensor([[0]]), torch.tensor([3]), torch.tensor([1]),
                             torch.tensor([1]), 4))
    assert logits.is_cuda
    p = SamplingParams(temperature=0.8, top_p=0.9, seed=11)
    a = [sample(logits, [p], [g])[0] for g in [make_generator(p)] for _ in range(5)]
    b = [sample(logits, [p], [g])[0] for g in [make_generator(p)] for _ in range(5)]
    assert a == b and all(0 <= t < SMALL.vocab_size for t in a)
    assert sample(logits, [SamplingParams(temperature=0)], [None])[0] == int(logits.argmax())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_serve_device_cuda_without_gpu_is_refused() -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "switchyard.cli", "engine", "serve", "--device", "cuda", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr
    r = subprocess.run([sys.executable, "-m", "switchyard.cli", "engine", "serve", "--device", "tpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--device must be one of cpu, cuda" in (r.stderr + r.stdout)


def _run_ranks(model_dir: Path, out: Path, world: int, collective: str, kind: str,
               env: dict[str, str] | None = None, follow: Path | None = None) -> list[list[torch.Tensor]]:
    """Run test_cuda_tp_harness.py as `world` ranks; each rank's gathered logits per step."""
    import os
    import subprocess
    import sys

    from procs import ROOT, free_port

    harness = Path(__file__).resolve().parent / "test_cuda_tp_harness.py"
    base = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "PYTHONPATH": str(ROOT), **(env or {})}
    procs = [subprocess.Popen([sys.executable, str(harness), str(model_dir), str(out), collective, kind,
                               *([str(follow)] if follow else [])],
                              env={**base, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(world)]
    try:
        logs = [p.communicate(timeout=600)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(x[-3000:] for x in logs)
    return [torch.load(out.with_suffix(f".rank{r}.pt")) for r in range(world)]


def test_cpu_tensor_parallel_sharding_equals_tp1(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The GPU model's TP code (vocab-parallel embedding and head, all-reduce after o/down) at
    TP=3, SmolLM2's TP width, on CPU with gloo (ring; oneshot is the comm tests' business):
    equals TP=1. The GPU test below runs the same harness on 2 GPUs, inside CUDA graphs."""
    cfg = dataclasses.replace(SMALL, num_layers=2)
    _random_llama_dir(tmp_path, cfg)
    from switchyard.engine.model.weights import load_shard, open_source

    src = open_source(tmp_path)
    one = Decoder(src.config, Shard(0, 1, src.config), load_shard(src, 0, 1), SingleRank(), max_slots=8,
                  max_len=64, device="cpu", dtype=torch.float32, backend="torch")
    ref = scenario([one], cfg.vocab_size, decode_steps=2)[0]
    got = _run_ranks(tmp_path, tmp_path / "tp3_ring", 3, "ring", "cpu")[0]
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (CI has none)")


@two_gpus
@pytest.mark.parametrize("collective", ["ring", "oneshot", "auto", "auto-forced-fail"])
def test_gpu_tensor_parallel_tp2_in_graphs(tmp_path, collective: str) -> None:  # type: ignore[no-untyped-def]
    """TP=2 on 2 GPUs, bf16, with NCCL ring, symmetric-memory oneshot (decode steps replayed as
    CUDA graphs with the all-reduces inside), or what `auto` picks: the logits agree with TP=1
    on one GPU within the bf16 bound; oneshot leaves both ranks bit-identical; `auto` with
    the oneshot test forced to fail serves on ring and says why."""
    import json

    from switchyard.engine.model.weights import load_shard, open_source
    from switchyard.engine.runner.comm import FORCE_FAIL_ENV

    cfg = dataclasses.replace(SMALL, num_layers=4, num_heads=8, num_kv_heads=4, hidden_size=512,
                              intermediate_size=1536)
    _random_llama_dir(tmp_path, cfg)
    src = open_source(tmp_path)
    one = Decoder(src.config, Shard(0, 1, src.config), load_shard(src, 0, 1), SingleRank(), max_slots=8,
                  max_len=64, device="cuda:0", dtype=torch.bfloat16)
    ref = scenario([one], cfg.vocab_size, decode_steps=2)[0]
    torch.save(ref, tmp_path / "ref.pt")  # the ranks follow its tokens
    forced = collective == "auto-forced-fail"
    ranks = _run_ranks(tmp_path, tmp_path / "tp2", 2, "auto" if forced else collective, "cuda",
                       {FORCE_FAIL_ENV: "1"} if forced else None, follow=tmp_path / "ref.pt")
    info = json.loads((tmp_path / "tp2.json").read_text())
    print(collective, {k: v for k, v in info.items() if k != "sweep"})
    # Steps whose all-reduces may go through NCCL run eagerly (NCCL hung inside our graphs);
    # one-shot steps are captured and replayed. Under `auto` that depends on the crossover it
    # measured (on 2 H200s: 1 KB, so the 8-slot steps here, 16 KB of embedding rows, ran eagerly).
    if collective == "oneshot":
        assert info["graphs"] > 0 and not info["eager_batch_buckets"]
    elif collective == "auto":
        assert info["graphs"] > 0 or info["eager_batch_buckets"]
    else:
        assert info["graphs"] == 0 and info["eager_batch_buckets"]
    worst = assert_close_to_reference(ref, ranks[0], REL_TOL)
    print(f"{collective}: max |logit diff| vs TP=1 = {worst:.4f} x std")
    if collective == "oneshot":
        assert all(torch.equal(a, b) for a, b in zip(ranks[0], ranks[1], strict=True))
    if forced:
        assert info["chosen"] == "ring" and FORCE_FAIL_ENV in info["reason"]
    elif collective == "auto":
        assert info["chosen"] in ("oneshot+ring", "ring") and info["reason"]


def test_warmup_runs_every_batch_bucket(small_weights: dict[str, torch.Tensor]) -> None:
    """Start-up warm-up (compile + capture on GPU) steps through every batch bucket up to
    max_num_seqs; on CPU the same steps run eagerly."""
    cfg = dataclasses.replace(SMALL, num_layers=1)
    w = {k: v for k, v in small_weights.items() if not k.startswith("layers.") or k.startswith("layers.0.")}
    m = Decoder(cfg, Shard(0, 1, cfg), w, SingleRank(), max_slots=20, max_len=64, device="cpu", backend="torch")
    seen: list[tuple[int, int]] = []
    graphs = m.graph_runner.graphs  # type: ignore[union-attr]
    core = graphs.step

    def spy(S: int, L: int) -> Iterator[None]:
        seen.append((S, L))
        yield from core(S, L)

    graphs.step = spy
    assert m.warmup() >= 0
    assert seen == [(1, 64), (2, 64), (4, 64), (8, 64), (16, 64), (20, 64)]
