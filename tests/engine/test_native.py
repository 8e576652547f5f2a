"""Native CPU kernels, each build this CPU can run (amx-bf16, avx512-bf16, avx2, avx2-w4a8). int4 weights: against
a float32 reference and torch's kernel, rows independent of their batch, the real SmolLM2
file run as int4 against float32. Decode attention: against the torch path, over scattered
cache slots."""

from __future__ import annotations

import pytest
import torch

from switchyard.engine.backends.cpu import native as nat
from switchyard.engine.model import linear
from switchyard.engine.model.step import Step


@pytest.fixture(params=[b.name for b in nat.BUILDS])
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Each native build in turn, where this CPU runs it; one that fails to build here fails."""
    monkeypatch.setenv("SWITCHYARD_NATIVE", request.param)
    nat.load.cache_clear()
    runs, why = nat.candidates()
    if not runs:
        pytest.skip(f"{request.param} kernels unavailable: {why}")
    lib, why = nat.load()
    if lib is None:
        nat.load.cache_clear()
        pytest.fail(f"{request.param} kernels did not build or load: {why}")
    yield request.param
    nat.load.cache_clear()


def _dequant(w: torch.Tensor, build: str) -> torch.Tensor:
    """What the int4 codes stand for, in float32: the reference the kernels approximate. The
    Q4_1-record builds keep each group's scale and minimum in float16 (as Q4_1 does) and
    choose the codes against those; the AMX build keeps them in float32."""
    n, k = w.shape
    g = w.view(n, k // 32, 32)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    if nat.build_named(build).int4_records:
        lo, scale = lo.half().float(), ((hi - lo) / 15).half().float()
    else:
        scale = ((hi - lo) / 15).clamp_min(1e-10)
    return (((g - lo) / scale.clamp_min(1e-10)).round().clamp(0, 15) * scale + lo).view(n, k)


@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536), (64, 32)])
def test_native_kernel_matches_float32_reference(build: str, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g) * 0.05
    b = torch.randn(n, generator=g) * 0.1
    q = linear.Int4(w, b)
    assert q.native is not None
    for m in (1, 3, 8, 16, 37):
        x = torch.randn(m, k, generator=g).to(torch.bfloat16)
        ref = x.float() @ _dequant(w, build).t() + b.to(torch.bfloat16).float()
        got = q(x).float()
        # bfloat16 output: 8 bits of mantissa, so half a step of 2^-8 relative to the largest value.
        assert (got - ref).abs().max() <= ref.abs().max() * 2**-7, m


def test_native_rows_do_not_depend_on_batch_or_threads(build: str) -> None:
    g = torch.Generator().manual_seed(1)
    q = linear.Int4(torch.randn(3072, 576, generator=g) * 0.05, None)
    x = torch.randn(37, 576, generator=g).to(torch.bfloat16)  # AMX: tiles of 16, 16 and 5 rows
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        batch = q(x)
        torch.set_num_threads(1)
        for m in (1, 5, 9, 16, 17):
            assert torch.equal(q(x[:m]), batch[:m])
        assert torch.equal(q(x[7:8]), batch[7:8])
        assert torch.equal(q(x[35:36]), batch[35:36])
    finally:
        torch.set_num_threads(before)


def test_native_and_torch_kernels_agree(build: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(2)
    w = torch.randn(576, 576, generator=g) * 0.05
    x = torch.randn(4, 576, generator=g).to(torch.bfloat16)
    ours = linear.Int4(w, None)
    monkeypatch.setattr(linear, "load_native", lambda: (None, "off for the test"))
    theirs = linear.Int4(w, None)
    assert ours.native is not None and theirs.native is None
    a, t = ours(x).float(), theirs(x).float()
    # torch keeps scale and offset in bfloat16, we keep float16 or float32: close, not equal.
    assert (a - t).abs().max() <= a.abs().max() * 2**-5


def test_kernel_unavailable_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    nat.load.cache_clear()
    try:
        monkeypatch.setenv("SWITCHYARD_NATIVE", "0")
        lib, why = nat.load()
        assert lib is None and "SWITCHYARD_NATIVE=0" in why
        assert linear.int4_kernel() == f"torch ({why})"
        q = linear.Int4(torch.randn(64, 64) * 0.05, None)  # and int4 still works, on torch's kernel
        assert q.native is None and q(torch.randn(2, 64).to(torch.bfloat16)).shape == (2, 64)
    finally:
        nat.load.cache_clear()


def test_build_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The best build the CPU runs; a named one only if the CPU runs it; a bad name says so."""
    zen4 = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16"}
    monkeypatch.setattr(nat, "_cpu_flags", lambda: zen4 | {"amx_tile", "amx_bf16"})  # Sapphire Rapids
    assert [b.name for b in nat.candidates()[0]] == ["amx-bf16", "avx512-bf16", "avx2"]
    monkeypatch.setattr(nat, "_cpu_flags", lambda: zen4)
    assert nat.pick()[0].name == "avx512-bf16"  # type: ignore[union-attr]
    monkeypatch.setenv("SWITCHYARD_NATIVE", "avx2")
    assert nat.pick()[0].name == "avx2"  # type: ignore[union-attr]
    monkeypatch.setattr(nat, "_cpu_flags", lambda: {"avx2", "fma", "f16c"})  # Zen 3, Haswell
    assert nat.pick()[0].name == "avx2"  # type: ignore[union-attr]
    monkeypatch.setenv("SWITCHYARD_NATIVE", "1")
    assert [b.name for b in nat.candidates()[0]] == ["avx2"]  # int8 activations only when named
    monkeypatch.setenv("SWITCHYARD_NATIVE", "avx2-w4a8")
    assert nat.pick()[0].name == "avx2-w4a8"  # type: ignore[union-attr]
    monkeypatch.setenv("SWITCHYARD_NATIVE", "avx512-bf16")
    assert nat.pick() == (None, "CPU lacks avx512_bf16, avx512bw, avx512f, avx512vl")  # f16c: Zen 3 has it
    monkeypatch.setenv("SWITCHYARD_NATIVE", "1")
    monkeypatch.setattr(nat, "_cpu_flags", lambda: {"sse4_2"})
    assert nat.pick() == (None, "CPU lacks avx2, f16c, fma")
    monkeypatch.setenv("SWITCHYARD_NATIVE", "avx9")
    build, why = nat.pick()
    assert build is None and "SWITCHYARD_NATIVE=avx9 names no build" in why


def test_a_build_that_fails_leaves_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler without a build's flags, or an OS that refuses AMX: the next build serves."""
    runs, _ = nat.candidates()
    if len(runs) < 2:
        pytest.skip("this CPU runs fewer than two builds")
    real = nat._open

    def refuse_first(compiler: str, build: nat.Build):  # type: ignore[no-untyped-def]
        if build is runs[0]:
            raise OSError("refused for the test")
        return real(compiler, build)

    monkeypatch.setattr(nat, "_open", refuse_first)
    nat.load.cache_clear()
    try:
        lib, name = nat.load()
        assert lib is not None and name == runs[1].name
    finally:
        nat.load.cache_clear()


def _greedy(model, prompts: list[list[int]], n: int, trace: list | None = None) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Prefill the prompts together (right-padded), then n - 1 decode steps; each step's
    logits appended to `trace` when given."""
    B, T = len(prompts), max(map(len, prompts))
    ids = torch.zeros(B, T, dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    lens, slots = torch.tensor([len(p) for p in prompts]), torch.arange(B)
    logits = model.forward(Step(ids, torch.arange(T).expand(B, T).contiguous(), slots, lens, lens, 0))
    out = [[int(t)] for t in logits.argmax(-1)]
    ctx = lens.clone()
    for _ in range(n - 1):
        if trace is not None:
            trace.append(logits.clone())
        ctx = ctx + 1
        logits = model.forward(Step(torch.tensor([[o[-1]] for o in out]), (ctx - 1).unsqueeze(1), slots,
                               torch.ones(B, dtype=torch.int64), ctx, B))
        for o, t in zip(out, logits.argmax(-1).tolist(), strict=True):
            o.append(t)
    return out


def _model(smollm2, dtype: str = "float32"):  # type: ignore[no-untyped-def]
    from switchyard.engine.model.decoder import Decoder
    from switchyard.engine.model.weights import Shard
    from switchyard.engine.runner.comm import SingleRank

    config, weights, _, _ = smollm2
    return Decoder(config, Shard(0, 1, config), weights, SingleRank(), max_slots=3, max_len=128, dtype=dtype)


@pytest.fixture(scope="module")
def int4_smollm2(smollm2):  # type: ignore[no-untyped-def]
    """SmolLM2 as int4, quantised once for the module (each test prefills the slots it reads)."""
    return _model(smollm2, "int4")


def test_smollm2_int4_equals_float32_and_batched_equals_alone(smollm2, int4_smollm2,  # type: ignore[no-untyped-def]
                                                              one_thread: None) -> None:
    tok, prompts = smollm2[2], smollm2[3]
    i4 = int4_smollm2
    with torch.inference_mode():
        exact = _greedy(_model(smollm2), prompts, 24)
        together = _greedy(i4, prompts, 24)
        alone = [_greedy(i4, [p], 24)[0] for p in prompts]
    # Q4_1 codes requantized to int4 groups lose nothing; bfloat16 activations could flip a
    # close call, but on these prompts the 24 greedy tokens are the float32 engine's.
    assert together == exact
    assert alone == together
    assert "Paris" in tok.decode(together[0])


def test_fused_layers_equal_op_by_op(smollm2, int4_smollm2, one_thread: None) -> None:  # type: ignore[no-untyped-def]
    """One rank with the int4 kernels runs each layer as two native calls around attention
    (native/layer.c); every step's logits, prefill and decode, are bit-identical to the
    op-by-op path's."""
    prompts = smollm2[3]
    i4 = int4_smollm2
    if i4.backend.lib is None:
        pytest.skip("native kernels unavailable here")
    assert i4.backend.fused
    with torch.inference_mode():
        fused: list[torch.Tensor] = []
        _greedy(i4, prompts, 6, fused)
        i4.backend.fused = False  # the same backend, op by op
        try:
            i4.k_cache.zero_()
            i4.v_cache.zero_()
            ops: list[torch.Tensor] = []
            _greedy(i4, prompts, 6, ops)
        finally:
            i4.backend.fused = True
    assert len(fused) == len(ops) == 5
    for a, b in zip(fused, ops, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
def test_native_decode_attention_equals_torch_path(build: str, kv_dtype: str) -> None:
    """Sequences in slots 5, 0 and 2 (out of order, with gaps), prompts of different lengths,
    then decode steps: the native kernel writes the cache and attends like the torch path,
    on a float32 or float16 cache."""
    import dataclasses

    from switchyard.engine.model.decoder import Decoder
    from switchyard.engine.model.random_weights import SMOLLM2_135M, random_weights
    from switchyard.engine.model.weights import Shard
    from switchyard.engine.runner.comm import SingleRank

    cfg = dataclasses.replace(SMOLLM2_135M, num_layers=2)
    w = random_weights(cfg, seed=3)
    models = [Decoder(cfg, Shard(0, 1, cfg), w, SingleRank(), max_slots=6, max_len=64, kv_dtype=kv_dtype)
              for _ in range(2)]
    assert models[0].k_cache.dtype == getattr(torch, kv_dtype)
    assert models[0].backend.attn is not None
    models[1].backend.attn = None  # the torch path: index_put into the cache, masked matmuls
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([9, 3, 14])
    slots = torch.tensor([5, 0, 2])
    ids = torch.zeros(3, 14, dtype=torch.int64)
    for i, n in enumerate(lens.tolist()):
        ids[i, :n] = torch.randint(0, cfg.vocab_size, (n,), generator=g)
    pos = torch.arange(14).expand(3, 14).contiguous()
    with torch.inference_mode():
        outs = [m.forward(Step(ids, pos, slots, lens, lens, 0)) for m in models]
        ctx = lens.clone()
        for _ in range(5):
            nxt = outs[0].argmax(-1).view(-1, 1)
            outs = [m.forward(Step(nxt, ctx.view(-1, 1).clone(), slots, torch.ones(3, dtype=torch.int64), ctx + 1, 6))
                    for m in models]
            ctx = ctx + 1
            assert (outs[0] - outs[1]).abs().max() <= 1e-4 * outs[1].std()
        # The same keys and values were written, in the same places (float16: the two paths'
        # float32 values may round to neighbouring float16 values).
        tol = {"atol": 1e-5} if kv_dtype == "float32" else {"rtol": 2e-3, "atol": 1e-3}
        for li in range(cfg.num_layers):
            assert torch.allclose(models[0].k_cache[li], models[1].k_cache[li], **tol)
            assert torch.allclose(models[0].v_cache[li], models[1].v_cache[li], **tol)


@pytest.mark.parametrize("attention", ["native", "torch"])
def test_scattered_blocks_and_a_shared_prefix_equal_contiguous_slots(build: str, attention: str) -> None:
    """Paged KV through block tables: a 40-token prompt in blocks 7, 2, 11 of a small pool; a
    second prompt with the same first 32 tokens reuses blocks 7 and 2 and prefills only its
    last 7 tokens; then both decode together. Logits equal (float32 rounding) a model that
    prefilled both prompts whole into contiguous slots; the shared blocks are never written."""
    import dataclasses

    from switchyard.engine.model.decoder import Decoder
    from switchyard.engine.model.random_weights import SMOLLM2_135M, random_weights
    from switchyard.engine.model.weights import Shard
    from switchyard.engine.runner.comm import SingleRank

    cfg = dataclasses.replace(SMOLLM2_135M, num_layers=2)
    w = random_weights(cfg, seed=8)
    ref = Decoder(cfg, Shard(0, 1, cfg), w, SingleRank(), max_slots=2, max_len=64)
    paged = Decoder(cfg, Shard(0, 1, cfg), w, SingleRank(), max_slots=2, max_len=64, num_blocks=12)
    assert paged.k_cache.shape[1:3] == (12, cfg.num_kv_heads) and paged.backend.attn is not None
    if attention == "torch":
        paged.backend.attn = None
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, cfg.vocab_size, (40,), generator=g)
    b = torch.cat((a[:32], torch.randint(0, cfg.vocab_size, (7,), generator=g)))
    one = torch.ones(2, dtype=torch.int64)

    def close(x: torch.Tensor, y: torch.Tensor) -> None:
        assert (x - y).abs().max() <= 1e-4 * y.std(), float((x - y).abs().max() / y.std())

    with torch.inference_mode():
        ids = torch.zeros(2, 40, dtype=torch.int64)
        ids[0], ids[1, :39] = a, b
        lens = torch.tensor([40, 39])
        want = ref.forward(Step(ids, torch.arange(40).expand(2, 40).contiguous(), torch.tensor([0, 1]), lens, lens, 0))
        tables = torch.tensor([[7, 2, 11, 3], [7, 2, 5, 9]])
        got_a = paged.forward(Step(a.view(1, 40), torch.arange(40).view(1, 40), torch.tensor([0]), lens[:1], lens[:1], 0,
                              tables[:1]))
        close(got_a, want[:1])
        shared = paged.k_cache[:, [7, 2]].clone(), paged.v_cache[:, [7, 2]].clone()
        got_b = paged.forward(Step(b[32:].view(1, 7), torch.arange(32, 39).view(1, 7), torch.tensor([1]),
                              torch.tensor([7]), lens[1:], 0, tables[1:]))
        close(got_b, want[1:])
        ctx = lens.clone()
        nxt = want.argmax(-1).view(2, 1)
        for _ in range(10):  # a moves on into block 3, b into block 9
            w1 = ref.forward(Step(nxt, ctx.view(2, 1).clone(), torch.tensor([0, 1]), one, ctx + 1, 2))
            w2 = paged.forward(Step(nxt, ctx.view(2, 1).clone(), torch.tensor([0, 1]), one, ctx + 1, 2, tables))
            close(w2, w1)
            nxt, ctx = w1.argmax(-1).view(2, 1), ctx + 1
        assert torch.equal(paged.k_cache[:, [7, 2]], shared[0]) and torch.equal(paged.v_cache[:, [7, 2]], shared[1])


def test_native_attention_refuses_a_slot_outside_the_cache(build: str) -> None:
    import dataclasses

    from switchyard.engine.model.decoder import Decoder
    from switchyard.engine.model.random_weights import SMOLLM2_135M, random_weights
    from switchyard.engine.model.weights import Shard
    from switchyard.engine.runner.comm import SingleRank

    cfg = dataclasses.replace(SMOLLM2_135M, num_layers=1)
    m = Decoder(cfg, Shard(0, 1, cfg), random_weights(cfg, seed=4), SingleRank(), max_slots=2, max_len=16)
    one = torch.ones(1, dtype=torch.int64)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="outside the cache"):
        m.forward(Step(torch.tensor([[5]]), torch.tensor([[0]]), torch.tensor([7]), one, one, 8))


def test_row_ops_match_torch(build: str) -> None:
    """RMSNorm (with and without the residual add), SwiGLU, RoPE and the refine's gathered dot
    products: one native call each, the same values as torch's ops to float32 rounding, and
    each row independent of its batch."""
    from switchyard.engine.backends.cpu.native import load as load_native
    from switchyard.engine.backends.cpu.rowops import RowOps, rms_norm_torch, rotate_torch

    g = torch.Generator().manual_seed(5)
    H, Hkv, D, max_len = 9, 3, 64, 40
    cos, sin = torch.randn(max_len, D, generator=g), torch.randn(max_len, D, generator=g)
    native, ref = RowOps(load_native()[0], cos, sin), RowOps(None, cos, sin)
    assert native.lib is not None
    x, delta, w = (torch.randn(2, 3, 576, generator=g) for _ in range(3))
    w = w[0, 0].contiguous()
    assert torch.allclose(native.rms_norm(x, w, 1e-5), rms_norm_torch(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    xa, xb = x.clone(), x.clone()
    ha, hb = native.add_rms_norm(xa, delta, w, 1e-5), ref.add_rms_norm(xb, delta, w, 1e-5)
    assert torch.equal(xa, xb) and torch.allclose(ha, hb, rtol=1e-5, atol=1e-6)  # the add is exact
    assert torch.equal(native.rms_norm(x[1:2, 2:3].contiguous(), w, 1e-5), native.rms_norm(x, w, 1e-5)[1:2, 2:3])
    gu = torch.randn(4, 1, 2 * 1536, generator=g) * 4
    gu[0, 0, :3] = torch.tensor([-200.0, 200.0, 0.0])  # far past exp's range both ways
    assert torch.allclose(native.silu_mul(gu), ref.silu_mul(gu), rtol=1e-5, atol=1e-5)
    qkv = torch.randn(2, 3, (H + 2 * Hkv) * D, generator=g)
    positions = torch.tensor([[0, 1, 2], [37, 38, 39]])
    mine = qkv.clone()
    assert native.rope_(mine, positions, H + Hkv, D) and not ref.rope_(qkv.clone(), positions, H + Hkv, D)
    c, s = cos[positions].unsqueeze(2), sin[positions].unsqueeze(2)
    q, k, v = qkv.split((H * D, Hkv * D, Hkv * D), dim=-1)
    want = torch.cat([rotate_torch(q.view(2, 3, H, D), c, s).flatten(2), rotate_torch(k.view(2, 3, Hkv, D), c, s).flatten(2),
                      v], dim=-1)
    assert torch.allclose(mine, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="position or row index out of range"):
        native.rope_(qkv.clone(), torch.tensor([[0, 1, 40], [0, 1, 2]]), H + Hkv, D)
    head, hs = torch.randn(1000, 576, generator=g), torch.randn(16, 576, generator=g)  # the logits' refine
    idx = torch.randint(0, 1000, (16, 32), generator=g)
    assert torch.allclose(native.gather_dot(head, hs, idx), ref.gather_dot(head, hs, idx), rtol=1e-5, atol=1e-4)
    assert torch.equal(native.gather_dot(head, hs[3:4].contiguous(), idx[3:4]), native.gather_dot(head, hs, idx)[3:4])
    with pytest.raises(RuntimeError, match="row index out of range"):
        native.gather_dot(head, hs[:1].contiguous(), torch.tensor([[1000]]))


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "bs"), [(9, 3, 64, 16), (16, 2, 80, 32), (4, 4, 128, 16)])
def test_native_attention_other_head_shapes(build: str, heads: int, kv_heads: int, dim: int, bs: int,
                                            kv_dtype: torch.dtype) -> None:
    """Groups of 1-8 query heads, head widths that are not a multiple of 64, blocks of 16 and 32
    positions scattered over the pool in no order, contexts that are not a multiple of 16 and
    one that ends at its table's last position, a float32 or float16 cache: the new key and
    value written into the right block (rounded to the cache's dtype), then softmax(qK)V over
    the sequence's blocks."""
    from switchyard.engine.backends.cpu.native import load as load_native

    lib = load_native()[0]
    g = torch.Generator().manual_seed(heads + dim + bs)
    num_blocks, width = 13, 4
    kc, vc = (torch.randn(num_blocks, kv_heads, bs, dim, generator=g).to(kv_dtype) for _ in range(2))
    tables = torch.randperm(num_blocks, generator=g)[:3 * width].view(3, width).contiguous()
    pos = torch.tensor([width * bs - 1, 0, bs + 5])
    B = len(pos)
    q = torch.randn(B, heads, dim, generator=g)
    k, v = torch.randn(B, kv_heads, dim, generator=g), torch.randn(B, kv_heads, dim, generator=g)
    want_k, want_v = kc.clone(), vc.clone()
    at = tables[torch.arange(B), pos // bs]
    want_k[at, :, pos % bs], want_v[at, :, pos % bs] = k.to(kv_dtype), v.to(kv_dtype)
    qkv = torch.cat((q, k, v), dim=1)  # each row as the projection writes it
    out = torch.empty_like(q)
    scale = dim ** -0.5
    assert lib.sy_decode_attn(qkv.data_ptr(), kc.data_ptr(), vc.data_ptr(), tables.data_ptr(), width, pos.data_ptr(),
                              B, heads, kv_heads, dim, num_blocks, bs, scale, out.data_ptr(), 2,
                              int(kv_dtype == torch.float16)) == 0
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    group = heads // kv_heads
    for b in range(B):
        L = int(pos[b]) + 1
        # The sequence's positions in order: its blocks one after another, [kv_heads, L, dim].
        K, V = (c[tables[b]].transpose(0, 1).reshape(kv_heads, width * bs, dim)[:, :L].float()
                .repeat_interleave(group, 0) for c in (want_k, want_v))
        ref = torch.softmax((q[b].unsqueeze(1) @ K.transpose(1, 2)).squeeze(1) * scale, -1).unsqueeze(1) @ V
        assert torch.allclose(out[b], ref.squeeze(1), rtol=1e-5, atol=1e-5), b
    bad = tables.clone()
    bad[2, 1] = num_blocks  # a block the position needs lies outside the pool
    assert lib.sy_decode_attn(qkv.data_ptr(), kc.data_ptr(), vc.data_ptr(), bad.data_ptr(), width, pos.data_ptr(),
                              B, heads, kv_heads, dim, num_blocks, bs, scale, out.data_ptr(), 2, 0) == 2
    assert torch.equal(kc, want_k)  # refused before writing anything
    past = torch.tensor([width * bs, 0, 1])  # a position past the table
    assert lib.sy_decode_attn(qkv.data_ptr(), kc.data_ptr(), vc.data_ptr(), tables.data_ptr(), width,
                              past.data_ptr(), B, heads, kv_heads, dim, num_blocks, bs, scale, out.data_ptr(), 2, 0) == 2
    assert lib.sy_decode_attn(qkv.data_ptr(), kc.data_ptr(), vc.data_ptr(), tables.data_ptr(), width, pos.data_ptr(),
                              B, heads, kv_heads, dim, num_blocks, 8, scale, out.data_ptr(), 2, 0) == 1  # blocks of 8


def test_native_top_k_orders_like_a_stable_sort(build: str) -> None:
    """The logits' top-k and the sampler's argmax: largest first, ties to the lower index (as a
    stable descending sort gives them), NaN never chosen; torch's topk where ours can't run."""
    from switchyard.engine.backends.cpu.native import load as load_native
    from switchyard.engine.backends.cpu.rowops import topk_indices

    lib = load_native()[0]
    g = torch.Generator().manual_seed(6)
    for trial in range(40):
        rows, n, k = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 20), (40, 3000), (1, 40)))
        x = torch.randn(rows, n, generator=g)
        if trial % 2:
            x = x.round()  # many ties
        want = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]
        assert torch.equal(topk_indices(lib, x, k), want), trial
    x = torch.tensor([[float("nan"), 1.0, 3.0, 3.0, float("nan"), -2.0]])
    assert topk_indices(lib, x, 3).tolist() == [[2, 3, 1]]
    assert topk_indices(lib, x.repeat(1, 20), 1).tolist() == [[2]]
    big = torch.randn(16, 49152, generator=g)
    assert torch.equal(topk_indices(lib, big, 1).view(-1), big.argmax(-1))
    assert torch.equal(topk_indices(lib, big, 32), big.topk(32, dim=-1).indices)  # no ties among randn
    assert topk_indices(lib, torch.full((1, 8), float("nan")), 2).shape == (1, 2)  # torch's answer, not an error
