"""The Triton decode kernels (engine/cuda_kernels) against the torch ops they replace.

Without a GPU they run in Triton's interpreter (CI has triton from the dev extra); on a GPU
they run compiled. Float32 inputs: equal to the torch path within float32 rounding; bfloat16:
within a few bfloat16 ulps of the torch path run on the same inputs. Every output buffer is
poisoned (NaN) first, so an element a kernel forgot to write fails the check.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton", reason="the fused decode kernels need triton (dev extra)")

from switchyard.engine.backends.cuda import kernels as ck  # noqa: E402
from switchyard.engine.backends.cuda import prefill_kernels as pk  # noqa: E402
from switchyard.engine.backends.torch_ops import rms_norm, rope_qkv  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


def _rand(*shape: int, dtype: torch.dtype = torch.float32, g: torch.Generator, std: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * std).to(device=DEV, dtype=dtype)


H, HKV, D = 6, 2, 32


def _qkv_case(M: int, dtype: torch.dtype, qk_norm: bool, bias: bool) -> dict:  # type: ignore[type-arg]
    """A QKV projection's inputs for M rows at distinct cache slots, the torch path's q, k and v,
    and NaN-poisoned caches."""
    g = torch.Generator().manual_seed(M)
    K, bs, max_len = 96, 4, 40
    nblocks = max(9, M)
    c = {"x": _rand(M, K, g=g), "ln": 1 + 0.1 * _rand(K, g=g),
         "w": _rand((H + 2 * HKV) * D, K, dtype=dtype, g=g, std=0.1),
         "b": _rand((H + 2 * HKV) * D, dtype=dtype, g=g, std=0.1) if bias else None}
    qn, kn = (1 + 0.1 * _rand(D, g=g), 1 + 0.1 * _rand(D, g=g)) if qk_norm else (None, None)
    c["qk_norm"] = torch.cat((qn, kn)) if qk_norm else None
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
    c["cos"], c["sin"] = torch.cat((freqs, freqs), -1).cos().to(DEV), torch.cat((freqs, freqs), -1).sin().to(DEV)
    c["pos"] = torch.randint(0, max_len, (M,), generator=g).to(DEV)
    c["blocks"] = torch.randperm(nblocks, generator=g)[:M].to(DEV)  # one row a block: distinct slots
    c["offs"] = c["pos"] % bs
    c["kc"] = torch.full((nblocks, HKV, bs, D), float("nan"), dtype=dtype, device=DEV)
    c["vc"] = torch.full_like(c["kc"], float("nan"))
    c["qkv"] = torch.nn.functional.linear(rms_norm(c["x"], c["ln"], 1e-5, dtype), c["w"], c["b"])
    c["ref"] = rope_qkv(c["qkv"], c["cos"][c["pos"]], c["sin"][c["pos"]], H, HKV, D, qn, kn, 1e-5, dtype)
    return c


def _check_q_and_cache(c: dict, q: torch.Tensor, dtype: torch.dtype) -> None:  # type: ignore[type-arg]
    q_ref, k_ref, v_ref = c["ref"]
    blocks, offs = c["blocks"], c["offs"]
    torch.testing.assert_close(q.float(), q_ref.float(), **_tol(dtype))
    torch.testing.assert_close(c["kc"][blocks, :, offs].float(), k_ref.float(), **_tol(dtype))
    torch.testing.assert_close(c["vc"][blocks, :, offs].float(), v_ref.float(), **_tol(dtype))
    written = torch.zeros(c["kc"].shape[0], c["kc"].shape[2], dtype=torch.bool)
    written[blocks.cpu(), offs.cpu()] = True
    for cache in (c["kc"], c["vc"]):
        assert torch.isnan(cache.cpu().float().transpose(1, 2)[~written]).all()  # nothing else touched


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm,bias", [(False, False), (True, True)])
@pytest.mark.parametrize("prefetch", [False, True])
def test_qkv_rope_writes_q_and_the_cache_as_the_torch_path(M: int, dtype: torch.dtype, qk_norm: bool,
                                                           bias: bool, prefetch: bool) -> None:
    c = _qkv_case(M, dtype, qk_norm, bias)
    tile = ck.Tile(16, 32, 4, 2, prefetch=True) if prefetch else None  # K = 96: a first tile and two more
    q = ck.qkv_rope(c["x"], c["ln"], c["w"], c["b"], c["qk_norm"], c["cos"], c["sin"], c["pos"], c["blocks"],
                    c["offs"], c["kc"], c["vc"], H, HKV, 1e-5, tile)
    _check_q_and_cache(c, q, dtype)


@pytest.mark.parametrize("M", [1, 3])
def test_qkv_rope_reads_each_rows_slot_from_its_block_table(M: int) -> None:
    """Given the rows' block tables instead of their slots, the kernel writes each row's key and
    value at (tables[m, pos // block_size], pos % block_size), as the slots given outright."""
    c = _qkv_case(M, torch.bfloat16, False, False)
    bs, nb = c["kc"].shape[2], 10  # _qkv_case: positions below 40, blocks of 4
    blocks = c["blocks"].cpu().tolist()
    # Every other entry names a block no row writes to: a wrong column writes there, which the
    # check sees (nothing but the rows' slots may leave NaN).
    spare = next(b for b in range(c["kc"].shape[0]) if b not in blocks)
    tables = torch.full((M, nb), spare, dtype=torch.int64)
    tables[torch.arange(M), (c["pos"] // bs).cpu()] = torch.tensor(blocks)
    q = ck.qkv_rope(c["x"], c["ln"], c["w"], c["b"], c["qk_norm"], c["cos"], c["sin"], c["pos"], None, None,
                    c["kc"], c["vc"], H, HKV, 1e-5, tables=tables.to(DEV))
    _check_q_and_cache(c, q, torch.bfloat16)


@pytest.mark.parametrize("M", [1, 21])  # 21: two row blocks of 16, the second ragged
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm,bias", [(False, False), (True, True)])
def test_rope_write_after_a_projection_as_the_torch_path(M: int, dtype: torch.dtype, qk_norm: bool,
                                                         bias: bool) -> None:
    c = _qkv_case(M, dtype, qk_norm, bias)
    q = ck.rope_write(c["qkv"], c["qk_norm"], c["cos"], c["sin"], c["pos"], c["blocks"], c["offs"], c["kc"], c["vc"],
                      H, HKV, 1e-5)
    _check_q_and_cache(c, q, dtype)


def _attention_ref(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tables: torch.Tensor,
                   ctx: torch.Tensor) -> torch.Tensor:
    M, H, D = q.shape
    Hkv, bs = kc.shape[1], kc.shape[2]
    out = []
    for m in range(M):
        n = max(int(ctx[m]), 1)
        t = torch.arange(n, device=q.device)
        blk = tables[m, t // bs]
        k = kc[blk, :, t % bs].float()  # [n, Hkv, D]
        v = vc[blk, :, t % bs].float()
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        s = torch.einsum("hd,nhd->hn", q[m].float(), k) / D ** 0.5
        out.append(torch.einsum("hn,nhd->hd", s.softmax(-1), v).reshape(H * D))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("span,ctx", [(32, [1, 17, 32, 0]), (64, [1, 37, 64, 0]), (2048, [1500, 2048, 513, 0])])
def test_paged_attention_reads_blocks_in_place(dtype: torch.dtype, span: int, ctx: list[int]) -> None:
    g = torch.Generator().manual_seed(span)
    M, H, Hkv, D, bs = len(ctx), 6, 2, 32, 16
    nb = span // bs
    nblocks = M * nb + 1
    kc = _rand(nblocks, Hkv, bs, D, dtype=dtype, g=g)
    vc = _rand(nblocks, Hkv, bs, D, dtype=dtype, g=g)
    tables = torch.randperm(nblocks - 1, generator=g)[: M * nb].view(M, nb).to(DEV)  # blocks out of order
    q = _rand(M, H, D, dtype=dtype, g=g)
    c = torch.tensor(ctx, device=DEV)
    got = ck.paged_attention(q, kc, vc, tables, c, span)
    assert ck.attention_shape(span) == {32: (1, 32), 64: (1, 64), 2048: (16, 128)}[span]
    torch.testing.assert_close(got.float(), _attention_ref(q, kc, vc, tables, c), **_tol(dtype))
    unsplit = ck.paged_attention(q, kc, vc, tables, c, span, splits=1)  # as a launch of many rows runs
    torch.testing.assert_close(unsplit.float(), _attention_ref(q, kc, vc, tables, c), **_tol(dtype))
    # Splits of several tiles: the newest position in a split's first tile (read after the wait)
    # or in a later one (read in the loop).
    for early in (True, False):  # the first tile loaded before the wait or after it
        tiled = ck.paged_attention(q, kc, vc, tables, c, span, block_n=16, splits=2, early=early)
        torch.testing.assert_close(tiled.float(), _attention_ref(q, kc, vc, tables, c), **_tol(dtype))
    # A caller's counters (the backend's one buffer): each split launch leaves them at zero for the next.
    counters = torch.zeros(M * Hkv + 3, dtype=torch.int32, device=DEV)
    for _ in range(2):
        again = ck.paged_attention(q, kc, vc, tables, c, span, counters=counters)
        assert torch.equal(again, got) and not counters.any()


@pytest.mark.parametrize("M", [1, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tile", [None, ck.Tile(16, 32, 4, 2, prefetch=True)], ids=["default", "prefetch"])
def test_gemv_residual_and_gate_up_silu(M: int, dtype: torch.dtype, tile: ck.Tile | None) -> None:
    g = torch.Generator().manual_seed(M)
    K, N, inter = 80, 48, 40
    a = _rand(M, K, dtype=dtype, g=g)
    w = _rand(N, K, dtype=dtype, g=g, std=0.1)
    x = _rand(M, N, g=g)
    ref = x + torch.nn.functional.linear(a, w).float()
    torch.testing.assert_close(ck.gemv_residual(a, w, x, tile), ref, **_tol(dtype))
    torch.testing.assert_close(ck.gemv_residual(a, w, x, tile, x_ready=True), ref, **_tol(dtype))

    ln = 1 + 0.1 * _rand(N, g=g)
    wgu = _rand(2 * inter, N, dtype=dtype, g=g, std=0.1)
    gu = torch.nn.functional.linear(rms_norm(x, ln, 1e-5, dtype), wgu)
    gate, up = gu.float().chunk(2, -1)
    ref_a = torch.nn.functional.silu(gate) * up
    torch.testing.assert_close(ck.gate_up_silu(x, ln, wgu, 1e-5, tile).float(), ref_a, **_tol(dtype))


def test_attention_splits_a_span_until_the_launch_fills_the_gpu() -> None:
    """One row of the 8B shape (8 kv heads) splits a 256 span 4 ways (the span's own bound: 64
    positions a split); 16 rows twice; 64 rows fill the GPU unsplit (one launch, no combine)."""
    assert ck.attention_shape(256, 1 * 8) == (4, 64)
    assert ck.attention_shape(512, 1 * 3) == (8, 64)
    assert ck.attention_shape(1024, 1 * 3) == (16, 64)
    assert ck.attention_shape(4096, 1 * 8) == (16, 128)
    assert ck.attention_shape(256, 16 * 8) == (2, 128)
    assert ck.attention_shape(256, 64 * 8) == (1, 128)
    assert ck.attention_shape(4096, 64 * 8) == (1, 128)


def test_rows_beyond_the_fused_limit_are_refused() -> None:
    with pytest.raises(AssertionError, match="1..16 rows"):
        ck._rows_pad(17)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_prefill_rope_split_and_silu_mul_as_the_torch_ops(qk_norm: bool) -> None:
    from switchyard.engine.backends.torch_ops import silu_mul

    g = torch.Generator().manual_seed(4)
    N, H, Hkv, D, max_len = 11, 6, 2, 32, 40
    qkv = _rand(N, (H + 2 * Hkv) * D, dtype=torch.bfloat16, g=g)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
    cos, sin = torch.cat((freqs, freqs), -1).cos().to(DEV), torch.cat((freqs, freqs), -1).sin().to(DEV)
    pos = torch.tensor([0, 1, 2, 3, 9, 10, 11, 20, 30, 38, 39], device=DEV)
    qn, kn = (1 + 0.1 * _rand(D, g=g), 1 + 0.1 * _rand(D, g=g)) if qk_norm else (None, None)
    ref = rope_qkv(qkv, cos[pos], sin[pos], H, Hkv, D, qn, kn, 1e-5, torch.bfloat16)
    got = pk.rope_split(qkv, cos, sin, pos, H, Hkv, D, torch.cat((qn, kn)) if qk_norm else None, 1e-5)
    for r, o in zip(ref, got, strict=True):
        assert o.shape == r.shape and o.dtype == r.dtype
        torch.testing.assert_close(o.float(), r.float(), **_tol(torch.bfloat16))
    # With the cache write (a prefill's): k and v into each token's slot, in scrambled blocks, and
    # nothing for a padding token (slot -1); every other slot left as it was.
    bs, nb = 4, 8
    kc, vc = (torch.full((nb, Hkv, bs, D), 7.0, dtype=torch.bfloat16, device=DEV) for _ in range(2))
    slots = torch.tensor([5, 6, 7, 12, 13, -1, 28, 29, 0, 1, -1], device=DEV)
    again = pk.rope_split(qkv, cos, sin, pos, H, Hkv, D, torch.cat((qn, kn)) if qk_norm else None, 1e-5,
                          cache=(kc, vc, slots))
    for a, b in zip(again, got, strict=True):
        assert torch.equal(a, b)
    live = slots >= 0
    for cache, new in ((kc, got[1]), (vc, got[2])):
        rows = cache.transpose(1, 2).reshape(nb * bs, Hkv, D)  # slot-major: block * bs + offset
        assert torch.equal(rows[slots[live]], new[live])
        untouched = torch.ones(nb * bs, dtype=torch.bool, device=DEV)
        untouched[slots[live]] = False
        assert bool((rows[untouched] == 7.0).all())
    gu = _rand(N, 2 * 3000, dtype=torch.bfloat16, g=g)  # 3000: more than one column block, a ragged last
    torch.testing.assert_close(pk.silu_mul(gu).float(), silu_mul(gu).float(), **_tol(torch.bfloat16))


def test_add_rms_kernel_as_the_torch_op() -> None:
    """The residual add + RMSNorm of a decode step past the fused rows (prefill_kernels.add_rms) as
    torch_ops.add_rms computes it: the float32 stream and the normed rows, for a hidden size that is
    a power of two or not, a bf16 or float32 addend, and bf16 or float32 out (the final norm's);
    prefill_kernels.rms_norm as torch_ops.rms_norm."""
    from switchyard.engine.backends.torch_ops import add_rms, rms_norm

    g = torch.Generator().manual_seed(8)
    for shape, ydt, out in (((11, 576), torch.bfloat16, torch.bfloat16), ((3, 1, 1000), torch.float32, torch.float32),
                            ((24, 4096), torch.bfloat16, torch.float32)):
        x, y = _rand(*shape, g=g, std=3.0), _rand(*shape, dtype=ydt, g=g)
        w = 1 + 0.1 * _rand(shape[-1], g=g)
        rx, rh = add_rms(x, y, w, 1e-5, out)
        gx, gh = pk.add_rms(x, y, w, 1e-5, out)
        assert gx.dtype == torch.float32 and gh.dtype == out and gh.shape == rh.shape == shape
        torch.testing.assert_close(gx, rx, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(gh.float(), rh.float(), **_tol(out))
        # The norm alone (a fused decode step's final norm): the input is left as it was.
        before = x.clone()
        torch.testing.assert_close(pk.rms_norm(x, w, 1e-5, out).float(), rms_norm(x, w, 1e-5, out).float(),
                                   **_tol(out))
        assert torch.equal(x, before)
        # With a second copy in bf16 (the LM head's input): the first one cast (exactly on a GPU, which
        # rounds to nearest as torch does; Triton's interpreter truncates).
        low = torch.empty(shape, dtype=torch.bfloat16, device=DEV)
        h = pk.rms_norm(x, w, 1e-5, torch.float32, low=low)
        if DEV.type == "cuda":
            assert torch.equal(low, h.to(torch.bfloat16))
        else:
            torch.testing.assert_close(low.float(), h, atol=0, rtol=2 ** -7)


def test_tile_for_fits_shared_memory_and_takes_the_sweeps_shapes() -> None:
    """tl.dot tiles (16 rows) of float32 weights shrink to fit an H200's shared memory (4 stages of
    the bf16 shapes asked ~260 KB there); one-row tiles are the sweep's."""
    for kind, n, k in (("qkv", 480, 576), ("gemv", 4096, 14336), ("gate_up", 14336, 4096)):
        for elem in (2, 4):
            t = ck.tile_for(kind, 16, n, k, elem)
            pair = 2 if kind != "gemv" else 1
            assert t.stages * (16 + pair * t.rows) * t.block_k * elem <= 160 * 1024
        assert ck.tile_for(kind, 16, n, k, 4) != ck.tile_for(kind, 16, n, k, 2)  # float32 shrank
    assert ck.tile_for("gate_up", 1, 14336, 4096) == ck.Tile(8, 256, 4, prefetch=True)
    assert ck.tile_for("gemv", 1, 576, 1536) == ck.Tile(4, 2048, 8, prefetch=True)
    assert ck.tile_for("gemv", 1, 576, 576) == ck.Tile(4, 1024, 4, prefetch=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grammar_mask_kernel_equals_the_torch_path(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """One Triton kernel masks a step's grammar rows as torch's four or five ops do
    (token_mask.apply_token_bitmask_torch): every row or some, a vocabulary as wide as the mask,
    narrower than its last word, and padded past it (never allowed); the free rows untouched. On a
    GPU in each of its launch forms: the pinned bitmask read in place or copied up first (and an
    unpinned one, always copied), the kernel launched through triton's JIT entry or, once compiled,
    through its handle (which the repeated shapes here reach)."""
    from switchyard.engine.backends.cpu.token_mask import apply_token_bitmask_torch
    from switchyard.engine.backends.cuda import token_mask as tm

    forms = [(True, True, True), (False, False, True), (True, True, False)] if DEV.type == "cuda" else [(True,) * 3]
    for in_place, compiled, pinned in forms:
        monkeypatch.setattr(tm, "IN_PLACE", in_place)
        monkeypatch.setattr(tm, "COMPILED", compiled)
        g = torch.Generator().manual_seed(7)
        for V, W in ((49152, 1536), (1000, 32), (1030, 32), (5000, 100)):
            bitmask = torch.randint(-2**31, 2**31 - 1, (5, W), dtype=torch.int32, generator=g)
            bitmask[1] = -1  # every token allowed
            bitmask[3] = 0
            bitmask[3, 0] = 1 << 2  # only token 2
            if pinned and DEV.type == "cuda":
                bitmask = bitmask.pin_memory()
            logits = _rand(5, V, dtype=dtype, g=g)
            for rows in ([0, 1, 2, 3, 4], [0, 2, 3], [4], [0, 2, 3]):
                fused, ref = logits.clone(), logits.clone()
                tm.apply_token_bitmask_cuda(fused, bitmask, rows)
                apply_token_bitmask_torch(ref, bitmask, rows)
                assert torch.equal(fused, ref), (V, W, rows, in_place, compiled, pinned)
                free = [i for i in range(5) if i not in rows]
                assert torch.equal(fused[free], logits[free])
                if 3 in rows:
                    assert torch.isfinite(fused[3]).sum() == 1 and torch.isfinite(fused[3, 2])
    # compiled on a GPU: the handles were kept (and used by the repeats above); interpreted: none
    assert (len(tm._launch.handles) > 0) == (DEV.type == "cuda")


def test_grammar_mask_kernel_waits_for_its_ticket(monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued before its bits exist (wait=(flag, ticket)), the masking waits (a one-program kernel
    polling flag[0], compiled with system-scope loads) until flag[0] reaches the ticket, then masks
    with the bits written before it (the torch path's -inf's); a wait that gives up (SPINS reads)
    writes its ticket to flag[1] and masks with the bits that are there."""
    import threading
    import time

    from switchyard.engine.backends.cpu.token_mask import apply_token_bitmask_torch
    from switchyard.engine.backends.cuda import token_mask as tm

    g = torch.Generator().manual_seed(11)
    V, W = 5000, 157
    bits = torch.randint(-2**31, 2**31 - 1, (3, W), dtype=torch.int32, generator=g)
    pinned = DEV.type == "cuda"
    bm = torch.zeros(3, W, dtype=torch.int32, pin_memory=pinned)
    flag = torch.zeros(2, dtype=torch.int64, pin_memory=pinned)
    logits = _rand(3, V, dtype=torch.float32, g=g)
    ref = logits.clone()
    apply_token_bitmask_torch(ref, bits, [0, 2])

    def fill() -> None:  # as the masker's thread does: the bits, then the ticket
        time.sleep(0.05)
        bm.copy_(bits)
        flag.numpy()[0] = 1

    x = logits.clone()
    filler = threading.Thread(target=fill)
    filler.start()
    tm.apply_token_bitmask_cuda(x, bm, [0, 2], (flag, 1))
    filler.join()
    assert torch.equal(x.cpu(), ref.cpu()) and flag.tolist() == [1, 0]
    monkeypatch.setattr(tm, "SPINS", 5)
    y = logits.clone()
    bm[0] = 0  # what a fill that never finishes may leave
    tm.apply_token_bitmask_cuda(y, bm, [0, 2], (flag, 2))  # ticket 2 never comes
    assert flag.tolist() == [1, 2] and torch.isinf(y[0]).all() and torch.equal(y[2].cpu(), ref[2].cpu())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
def test_download_pool_reuses_its_buffers_and_brings_each_download_back() -> None:
    """Downloads from a DownloadPool bring back what the device holds, each read before the next
    is started (the engine's order), in its shapes and dtypes, the buffers taken in turn: the
    same buffer `depth` downloads of a shape later, and no new pinned tensor in between."""
    from switchyard.engine.backends.transfer import Download, DownloadPool

    pool = DownloadPool(depth=3)
    seen: list[int] = []
    for i in range(8):
        toks = torch.arange(i, i + 5, device=DEV)
        lps = torch.full((2, 4), float(i), device=DEV)
        d = Download([toks, lps], pool)
        toks.add_(100)  # queued after the copy: the download holds the values from before
        got = d.get()
        assert got[0].tolist() == list(range(i, i + 5)) and got[1].eq(float(i)).all()
        assert got[0].is_pinned() and got[1].dtype == torch.float32
        seen.append(got[0].data_ptr())
    assert seen[:3] == seen[3:6] and len(set(seen)) == 3
    assert Download([torch.ones(1, device=DEV)]).get()[0].data_ptr() not in seen  # no pool: its own buffer


def _layer_chain(pdl: bool, layers: int, M: int, graph: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`layers` decode layers of the fused kernels on fixed random weights (each kernel reading
    the one before's output, the KV cache written and read back): the residual out and the cache."""
    from switchyard.engine.backends.cuda.triton_common import pdl_supported

    assert not pdl or pdl_supported(DEV)
    g = torch.Generator().manual_seed(11)
    hid, inter, span, bs = H * D, 160, 64, 16
    dt = torch.bfloat16
    ws = [(_rand((H + 2 * HKV) * D, hid, dtype=dt, g=g, std=0.05), _rand(hid, H * D, dtype=dt, g=g, std=0.05),
           _rand(2 * inter, hid, dtype=dt, g=g, std=0.05), _rand(hid, inter, dtype=dt, g=g, std=0.05))
          for _ in range(layers)]
    ln = 1 + 0.1 * _rand(hid, g=g)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(span, dtype=torch.float32), inv)
    cos, sin = torch.cat((freqs, freqs), -1).cos().to(DEV), torch.cat((freqs, freqs), -1).sin().to(DEV)
    nb = span // bs
    kc = _rand(layers, M * nb + 1, HKV, bs, D, dtype=dt, g=g)
    vc = _rand(layers, M * nb + 1, HKV, bs, D, dtype=dt, g=g)
    tables = torch.arange(M * nb, device=DEV).view(M, nb)
    pos = torch.full((M,), 40, device=DEV)
    ctx = pos + 1
    blocks = tables[torch.arange(M, device=DEV), pos // bs]
    offs = pos % bs
    x0 = _rand(M, hid, g=g)

    def run() -> torch.Tensor:
        x = x0
        for i, (wqkv, wo, wgu, wd) in enumerate(ws):
            q = ck.qkv_rope(x, ln, wqkv, None, None, cos, sin, pos, blocks, offs, kc[i], vc[i], H, HKV, 1e-5, pdl=pdl)
            o = ck.paged_attention(q, kc[i], vc[i], tables, ctx, span, pdl=pdl)
            x = ck.gemv_residual(o, wo, x, pdl=pdl, x_ready=True)  # as the backend launches them
            x = ck.gemv_residual(ck.gate_up_silu(x, ln, wgu, 1e-5, pdl=pdl), wd, x, pdl=pdl, x_ready=True)
        return x

    if not graph:
        return run(), kc
    run()  # compile outside the capture
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        out = run()
    for _ in range(3):
        gr.replay()
    torch.cuda.synchronize()
    return out, kc


@pytest.mark.skipif(DEV.type != "cuda" or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch needs a Hopper (sm90) GPU or later")
@pytest.mark.parametrize("M", [1, 4])
def test_pdl_kernels_compute_what_serial_launches_do(M: int) -> None:
    """The fused kernels launched with PDL (each starting while the one before runs, waiting at
    gdc_wait before it reads its output), eagerly and replayed in a CUDA graph, give the same bits
    as launched one after another: a read or write before the wait would race and differ."""
    ref, kc_ref = _layer_chain(False, 12, M, graph=False)
    for graph in (False, True):
        got, kc = _layer_chain(True, 12, M, graph=graph)
        assert torch.equal(got, ref), graph
        assert torch.equal(kc, kc_ref), graph


@pytest.mark.parametrize("V,hid,N", [pytest.param(49152, 96, 1, marks=pytest.mark.skipif(
    DEV.type != "cuda", reason="SmolLM2's vocabulary: 30 s in Triton's interpreter")), (2100, 80, 2), (1030, 40, 1)])
def test_head_refine_equals_the_torch_path(V: int, hid: int, N: int) -> None:
    """head_kernels.refine: the low-precision logits as float32, each row's best 32 (found in
    chunks, then among the chunks' best) recomputed against the float32 head, as the torch
    backend's topk, batched matmul and scatter do: the same 32 positions rewritten with the same
    values, the rest the low-precision logits exactly; a tie at the top (equal logits in two
    chunks) both refined."""
    from switchyard.engine.backends.cuda import head_kernels as hk
    from switchyard.engine.backends.torch_backend import TorchBackend

    g = torch.Generator().manual_seed(V)
    w = _rand(V, hid, g=g, std=0.1)
    h = _rand(N, hid, g=g)
    exact = h @ w.T
    raw = (exact + 0.05 * _rand(N, V, g=g)).to(torch.bfloat16)  # a bf16 head's logits, wrong by more than bf16's step
    raw[0, 7] = raw[0, V - 1] = raw[0].max() + 1
    while True:  # no tie at the 32nd (bf16 has few values): which of tied logits is refined is unspecified
        top33 = raw.float().topk(33, dim=-1).values
        if (top33[:, 31] > top33[:, 32]).all():
            break
        raw = torch.where(raw.float() == top33[:, 32:33], raw.float() - 0.1, raw.float()).to(torch.bfloat16)
    # Into the leading rows of a static buffer (the graph runner's step_out), the rest untouched; one call
    # (25 s a call in Triton's interpreter); the allocating path (out=None) is test_head_candidates' and, on a
    # GPU, the decoder's.
    static = torch.full((N + 2, V), 7.0, device=raw.device)
    got = hk.refine(raw, w, h, 32, out=static[:N])
    assert got.data_ptr() == static.data_ptr() and bool((static[N:] == 7.0).all())
    ref = TorchBackend.refine(None, raw.clone(), w, h, 32)  # type: ignore[arg-type]  (refines in place)
    assert got.dtype == torch.float32 and got.shape == (N, V)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    top = raw.float().topk(32, dim=-1).indices
    torch.testing.assert_close(got.gather(1, top), exact.gather(1, top), atol=1e-5, rtol=1e-5)
    rest = torch.ones_like(raw, dtype=torch.bool).scatter_(1, top, False)
    assert torch.equal(got[rest], raw.float()[rest])


def test_row_argmax_is_torchs_argmax() -> None:
    """The sampler's GPU argmax (head_kernels.RowArgmax): the first of tied maxima, across chunks
    and within one, a NaN as the largest, -0.0 tying +0.0, rows of -inf, a vocabulary that is no
    multiple of the chunk and one past 64 chunks of 2,048 (wider chunks); its row counters come
    back to zero, and grow with the rows."""
    from switchyard.engine.backends.cuda.head_kernels import RowArgmax

    g = torch.Generator().manual_seed(3)
    am = RowArgmax()
    for V in (2 * 2048 + 77, 131_072 + 4099):
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
        for rows in (3, 7, 7):  # the counters grow, then come back to zero for the next launch
            assert torch.equal(am(x[:rows]), x[:rows].argmax(-1)), (V, rows)
            assert am.counters is not None and not am.counters.any()
    xb = torch.randn(2, 5000, generator=g).to(torch.bfloat16).to(DEV)
    assert torch.equal(am(xb), xb.argmax(-1))


def test_sampler_takes_greedy_rows_from_the_gpu_argmax() -> None:
    """sample_tokens with the output stage's GPU argmax: greedy rows its choice, seeded rows their
    own draw, the same tokens as the sampler without it (torch's argmax)."""
    from switchyard.engine.backends.cuda.head_kernels import RowArgmax
    from switchyard.engine.core.sampling import SamplingParams, make_generator, sample_tokens

    g = torch.Generator().manual_seed(11)
    logits = _rand(4, 3000, g=g).to(DEV)
    logits[2, 17] = logits[2, 2900] = logits[2].max() + 1  # a tie: the lower position
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=5),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=9)]
    kernel, seen = RowArgmax(), []

    def argmax(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape)
        return kernel(x)

    ours = sample_tokens(logits, params, [make_generator(p) for p in params], argmax)
    theirs = sample_tokens(logits, params, [make_generator(p) for p in params])
    assert seen == [logits.shape]  # the greedy rows came from the kernel
    assert torch.equal(ours, theirs) and int(ours[2]) == 17
