"""The GPU decode and prefill variants the benches measure against the served backends: what
lost on an H200 stays here, as backends of the benches' own, not as options of the served ones.

- `torch-index-sdpa`: the torch backend with keys and values written by advanced indexing
  (`cache[blocks, :, offsets] = k`) and decode attention through memory-efficient SDPA over an
  additive mask: both slower than the served index_copy_ rows and batched matmuls around a fused
  softmax (measured on the per-slot cache before paging; tests/engine/test_cuda.py checks they
  still compute the same).
- `cuda-prefill-flash`, `cuda-prefill-cudnn`: the cuda backend with one attention kernel for
  every prefill, where the served one picks cuDNN's from 4096 prompt tokens and flash below
  (bench/engine_cuda_probe.py measures the TTFT of both).
- `cuda-fused-rows-N`: the cuda backend with its fused decode layers up to N rows (a step's batch
  bucket), cuBLAS's projections and the paged attention kernel past them, where the served one
  fuses up to backends/cuda/backend.fused_rows(hidden) rows; N = 0: never fused
  (bench/engine_cuda_sweep.py sweeps it).
- `cuda-torch-glue`: `cuda-fused-rows-0` (cuBLAS's projections at every batch) as it ran before
  kernels.rope_write: torch's RoPE (compiled) on angles gathered once a step, and the KV write
  as two index copies.
- `cuda-attention-by-span`: the cuda backend with the paged attention split by the span alone
  (up to 16 ways) at every batch, as before its split count took the launch's rows into account.
- `cuda-no-pdl`: the cuda backend with its kernels launched one after another, without
  programmatic dependent launch (as before it).
- `cuda-attention-unsplit`: the cuda backend with the paged attention never split (one kernel,
  no combine).
- `cuda-persistent`: the cuda backend with a one-row step's layers in one persistent launch
  (bench/persistent_kernel.py) where the model allows: slower than the served five kernels a
  layer on an H200 (bench/results/gpu_persistent/). `cuda-persistent-2k`: the same with loads of
  2,048 weight elements a warp (persistent_kernel.TILE 4,096: each stage's slice in one load, which
  spills registers at 8 warps).
- `cuda-attention-SxN` (1x128, 1x256, 2x128, 4x64, 8x32, 8x64, 16x32): the cuda backend with the paged
  attention in S splits of N-position loads at every span and batch (the served pick before
  bench/results/gpu_attention_early/: 8x32 at a 256 span and 16x32 at 512 for one row of SmolLM2 or 8B,
  8x32 at 256 for 16 rows of SmolLM2; after it 4x64 and 8x64).
- `cuda-attention-early`, `cuda-attention-late`: the cuda backend with the paged attention's first tile
  loaded before its PDL wait at every shape, or after it at every shape (the served one: by
  paged_attention._early, in launches of up to 256 programs of tiles of up to EARLY_TILE elements).
- `cuda-torch-final`: the cuda backend with a fused decode step's final RMSNorm in torch's ops (a
  reduction and five elementwise kernels), as before prefill_kernels.rms_norm.
- `cuda-late-residual`: the cuda backend with o_proj's and down_proj's residual loaded after their PDL
  wait, behind the product (as before bench/results/gpu_attention_early/), not before it.
- `cuda-torch-head`: the cuda backend with the LM head's refinement in torch's ops (float copy,
  top-k, gather, batched matmul, scatter), as before head_kernels.py.
- `cuda-chunk-refine`: the cuda backend with the LM head's refinement in one kernel, every chunk's best
  32 recomputed by the program that found them (bench/chunk_refine.py), not the row's best 32 by a
  second launch: a candidate, measured and not served (faster alone, equal in the step:
  bench/results/gpu_head call 9).
- `cuda-1row-KIND=RxKxW` (ONE_ROW_TILES; `cuda-1row-attention=W`): the cuda backend with a one-row
  step's KIND kernel (qkv, o, gate_up, down) at another tile (outputs a program x reduction elements a
  load x warps), or its attention at another warp count; `_one_row_tiles` takes several, ';'-separated.
- `cuda-compiled-glue`: the cuda backend with a decode step past the fused rows taking its residual
  add + RMSNorm and SiLU * up from torch's compiled ops (as before 2026-12-06), not Triton's.
- `cuda-torch-slots`: the cuda backend with a fused decode step's KV slots (block, offset) computed by
  torch's ops once a step (a division, a gather, a remainder), as before kernels.qkv_rope read them
  from the block tables. `cuda-logits-copy`: with the LM head's refined logits in a tensor of their
  own, copied into the graph's output after it (as before head_kernels.refine took `out`).
  `cuda-head-cast`: with the LM head's bf16 input cast from the final norm's float32 rows by a
  launch of its own (as before prefill_kernels.rms_norm wrote both). `cuda-step-before`: all three.

  import engine_cuda_variants  # registers them; then Decoder(..., backend=NAME) or decoder.view(NAME)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from switchyard.engine.backends import attention, registry
from switchyard.engine.backends.base import LayerWeights, ModelDims
from switchyard.engine.backends.torch_backend import CUDNN_PREFILL, FLASH_PREFILL, TorchBackend, TorchPlan

_DECODE_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # takes a mask, capturable


class IndexSdpaBackend(TorchBackend):
    name = "torch-index-sdpa"

    def write_kv(self, kc: torch.Tensor, vc: torch.Tensor, blocks: torch.Tensor, offs: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor) -> None:
        kc[blocks, :, offs] = k
        vc[blocks, :, offs] = v

    def _shared(self, p: TorchPlan) -> None:
        super()._shared(p)
        if p.decode:  # SDPA takes its mask in the model dtype
            p.bias = p.bias.to(self.d.dtype)  # type: ignore[union-attr]

    def decode_attention(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, p: TorchPlan) -> torch.Tensor:
        S, Hkv = p.B, self.d.kv_heads
        kc, vc = attention.gather(kc, p.tables), attention.gather(vc, p.tables)  # type: ignore[arg-type]
        with sdpa_kernel(_DECODE_SDPA):
            return F.scaled_dot_product_attention(q.view(S, Hkv, self.d.heads // Hkv, self.d.head_dim), kc, vc,
                                                  attn_mask=p.bias)


def _prefill_with(kernels: list[SDPBackend], name: str) -> type:
    from switchyard.engine.backends.cuda.backend import CudaBackend

    class PrefillBackend(CudaBackend):
        def prefill_kernels(self, tokens: int) -> list[SDPBackend]:
            return kernels

    PrefillBackend.name = name
    return PrefillBackend


def _fused_rows(limit: int) -> type:
    from switchyard.engine.backends.cuda.backend import CudaBackend

    class FusedRowsBackend(CudaBackend):
        def decode_plan(self, ids: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor, tables: torch.Tensor,
                        span: int, graphs: bool) -> TorchPlan:
            p = super().decode_plan(ids, pos, ctx, tables, span, graphs)
            p.fused = limit >= p.B
            return p

    FusedRowsBackend.name = f"cuda-fused-rows-{limit}"
    return FusedRowsBackend


def _torch_glue() -> type:
    class TorchGlueBackend(_fused_rows(0)):  # type: ignore[misc]
        name = "cuda-torch-glue"

        def _shared(self, p: TorchPlan) -> None:
            super()._shared(p)
            if p.decode and not p.fused:
                p.cos, p.sin = self.d.cos[p.pos], self.d.sin[p.pos]

        def project_qkv(self, layer: LayerWeights, kc: torch.Tensor, vc: torch.Tensor, h: torch.Tensor,
                        p: TorchPlan) -> torch.Tensor:
            if not p.decode:
                return super().project_qkv(layer, kc, vc, h, p)
            q, k, v = TorchBackend._rope(self, layer, h, p)
            self.write_kv(kc, vc, p.w_blocks, p.w_offs, k, v)
            return q

    return TorchGlueBackend


def _compiled_glue() -> type:
    from switchyard.engine.backends.cuda.backend import CudaBackend

    class CompiledGlueBackend(CudaBackend):
        name = "cuda-compiled-glue"
        TRITON_GLUE = False

    return CompiledGlueBackend


def _step_cut(name: str, slots_in_kernel: bool, refine_out: bool, norm_low: bool = True) -> type:
    """The cuda backend with a fused decode step's KV slots by torch's ops (slots_in_kernel False),
    its logits copied into the graph's output after the head (refine_out False), and/or the LM
    head's input cast after the final norm (norm_low False)."""
    from switchyard.engine.backends.cuda.backend import CudaBackend

    class StepCutBackend(CudaBackend):
        SLOTS_FROM_TABLES = slots_in_kernel

        def refine(self, raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int,
                   out: torch.Tensor | None = None) -> torch.Tensor:
            return super().refine(raw, w, h, k, out if refine_out else None)

        def final(self, x: torch.Tensor, carry: torch.Tensor | None, norm: torch.Tensor, p: TorchPlan) -> torch.Tensor:
            if p.fused and not norm_low:
                from switchyard.engine.backends.cuda import prefill_kernels as pk

                return pk.rms_norm(x, norm, self.d.eps, torch.float32)
            return super().final(x, carry, norm, p)

    StepCutBackend.name = name
    return StepCutBackend


def _attention_shaped(name: str, shape: Callable[[Any, int, int], tuple[int, int]], early: bool | None = None) -> type:
    """The cuda backend with the decode attention's (splits, positions a load) from shape(kernels,
    span, rows x kv heads); `early`: its first tile loaded before the PDL wait always (True) or
    never (False), not by the served rule (None)."""
    from switchyard.engine.backends.cuda import kernels as ck
    from switchyard.engine.backends.cuda.backend import CudaBackend

    class AttentionShapedBackend(CudaBackend):
        def attention(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, p: TorchPlan) -> torch.Tensor:
            if not p.decode:
                return super().attention(q, kc, vc, p)
            splits, block_n = shape(ck, p.L, p.B * self.d.kv_heads)
            return ck.paged_attention(q, kc, vc, p.tables, p.ctx, p.L, block_n, splits, pdl=self.pdl,
                                      counters=self.counters, early=early)

    AttentionShapedBackend.name = name
    return AttentionShapedBackend


def _by_span(ck: Any, span: int, programs: int) -> tuple[int, int]:
    return ck.attention_shape(span)  # as before the launch's rows counted


def _unsplit(ck: Any, span: int, programs: int) -> tuple[int, int]:
    return 1, ck.attention_shape(span, programs)[1]


def _served(ck: Any, span: int, programs: int) -> tuple[int, int]:
    return ck.attention_shape(span, programs)


def _fixed(splits: int, block_n: int, ck: Any, span: int, programs: int) -> tuple[int, int]:
    return splits, block_n


def _late_residual() -> type:
    from switchyard.engine.backends.cuda import kernels as ck
    from switchyard.engine.backends.cuda.backend import CudaBackend

    class LateResidualBackend(CudaBackend):
        name = "cuda-late-residual"

        def layer_out(self, layer: LayerWeights, x: torch.Tensor, o: torch.Tensor,
                      p: TorchPlan) -> tuple[torch.Tensor, torch.Tensor | None]:
            if not p.fused:
                return super().layer_out(layer, x, o, p)
            x = ck.gemv_residual(o, layer.o.w, x, pdl=self.pdl)
            h = ck.gate_up_silu(x, layer.ln2, layer.gate_up.w, self.d.eps, pdl=self.pdl)
            return ck.gemv_residual(h, layer.down.w, x, pdl=self.pdl), None

    return LateResidualBackend


def _one_row_tiles(name: str, spec: str) -> type:
    """The cuda backend with a one-row step's kernels launched at other shapes: spec `KIND=RxKxW`
    (qkv, o, gate_up, down: outputs a program x reduction elements a load x warps) or `attention=W`
    (the paged attention's warps), ';'-separated. Steps of more rows run as served."""
    from switchyard.engine.backends.cuda import kernels as ck
    from switchyard.engine.backends.cuda.backend import CudaBackend

    tiles: dict[str, ck.Tile] = {}
    attn_warps = 4
    for part in spec.split(";"):
        kind, _, shape = part.partition("=")
        if kind == "attention":
            attn_warps = int(shape)
        else:
            r, bk, w = (int(v) for v in shape.split("x"))
            tiles[kind] = ck.Tile(r, bk, w, prefetch=True)

    class OneRowTilesBackend(CudaBackend):
        def layer_in(self, layer: LayerWeights, kc: torch.Tensor, vc: torch.Tensor, x: torch.Tensor,
                     carry: torch.Tensor | None, p: TorchPlan) -> tuple[torch.Tensor, Any]:
            if not (p.fused and p.B == 1):
                return super().layer_in(layer, kc, vc, x, carry, p)
            d = self.d
            return x, ck.qkv_rope(x, layer.ln1, layer.qkv.w, layer.qkv.b, layer.qk_norm, d.cos, d.sin, p.pos,
                                  p.w_blocks, p.w_offs, kc, vc, d.heads, d.kv_heads, d.eps, tile=tiles.get("qkv"),
                                  pdl=self.pdl, tables=p.tables)

        def attention(self, q: Any, kc: torch.Tensor, vc: torch.Tensor, p: TorchPlan) -> torch.Tensor:
            if not (p.decode and p.B == 1):
                return super().attention(q, kc, vc, p)
            return ck.paged_attention(q, kc, vc, p.tables, p.ctx, p.L, warps=attn_warps, pdl=self.pdl,
                                      counters=self.counters)

        def layer_out(self, layer: LayerWeights, x: torch.Tensor, o: torch.Tensor,
                      p: TorchPlan) -> tuple[torch.Tensor, torch.Tensor | None]:
            if not (p.fused and p.B == 1):
                return super().layer_out(layer, x, o, p)
            x = ck.gemv_residual(o, layer.o.w, x, tile=tiles.get("o"), pdl=self.pdl, x_ready=True)
            h = ck.gate_up_silu(x, layer.ln2, layer.gate_up.w, self.d.eps, tile=tiles.get("gate_up"), pdl=self.pdl)
            return ck.gemv_residual(h, layer.down.w, x, tile=tiles.get("down"), pdl=self.pdl, x_ready=True), None

    OneRowTilesBackend.name = name
    return OneRowTilesBackend


# One-row tiles and warps to sweep against the served ones (kernels.tile_for at SmolLM2's K = 576: qkv
# 2x1024x4, o 2x1024x4 (4x1024x4 after gpu_head/ call 6), gate_up 4x1024x4, down (K = 1,536) 2x2048x4
# (4x2048x8 after it); the attention 4 warps).
ONE_ROW_TILES = ("qkv=1x1024x4", "qkv=2x1024x2", "qkv=4x1024x4", "qkv=2x1024x8",
                 "o=1x1024x2", "o=1x1024x4", "o=2x1024x2", "o=4x1024x4", "o=2x1024x8",
                 "gate_up=2x1024x4", "gate_up=4x1024x2", "gate_up=4x1024x8", "gate_up=8x1024x8",
                 "down=1x2048x4", "down=2x2048x8", "down=2x1024x4", "down=4x2048x8", "down=2x2048x2",
                 "attention=2", "attention=8",
                 # after call 6: o and down served at 4x1024x4 and 4x2048x8; the tiles before, and combinations
                 "o=2x1024x4;down=2x2048x4", "o=2x1024x2;down=4x2048x8", "attention=8;o=4x1024x4;down=4x2048x8",
                 "gate_up=2x1024x4;o=4x1024x4;down=4x2048x8")


def _torch_final() -> type:
    from switchyard.engine.backends.cuda.backend import CudaBackend

    class TorchFinalBackend(CudaBackend):
        name = "cuda-torch-final"

        def final(self, x: torch.Tensor, carry: torch.Tensor | None, norm: torch.Tensor, p: TorchPlan) -> torch.Tensor:
            return TorchBackend.final(self, x, carry, norm, p)

    return TorchFinalBackend


def _no_pdl() -> type:
    from switchyard.engine.backends.cuda.backend import CudaBackend

    class NoPdlBackend(CudaBackend):
        name = "cuda-no-pdl"

        def __init__(self, dims: ModelDims, layers: Sequence[LayerWeights]) -> None:
            super().__init__(dims, layers)
            self.pdl = False

    return NoPdlBackend


def _persistent(name: str, tile: int) -> type:
    import persistent_kernel as pk

    from switchyard.engine.backends.cuda.backend import WIDE_HIDDEN, CudaBackend

    class PersistentBackend(CudaBackend):
        """The cuda backend with a one-row step's layers in one launch (persistent_kernel.py) where
        the model fits it (`persistent_reason` in status() where it does not)."""

        SLOTS_FROM_TABLES = False  # run_layers takes each row's (block, offset)

        def __init__(self, dims: ModelDims, layers: Sequence[LayerWeights]) -> None:
            super().__init__(dims, layers)
            self.unfit = pk.supported(dims, layers, WIDE_HIDDEN)
            if not self.unfit:
                self.shape = pk.Shape.of(dims, layers, pk.programs_for(dims.device), tile=tile)
                self.offsets = pk.layer_offsets(layers, pk.cache_layer_stride(dims))
                self.barrier = torch.zeros(3, dtype=torch.int32, device=dims.device)  # run_layers' counters

        def status(self) -> dict[str, Any]:
            st = {**super().status(), "persistent": not self.unfit}
            if self.unfit:
                st["persistent_reason"] = self.unfit
            elif self.barrier[2].item():
                st["persistent_reason"] = "a barrier timed out: its steps were wrong"  # persistent_kernel._wait
            return st

        def all_layers(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       p: TorchPlan) -> torch.Tensor | None:
            if self.unfit or not p.decode or p.B != 1:
                return None
            return pk.run_layers(x, self.layers, self.offsets, k_cache, v_cache, self.d, p.pos, p.w_blocks, p.w_offs,
                                 p.tables, p.ctx, p.L, self.barrier, self.shape, grid_sync=x.is_cuda)

    PersistentBackend.name = name
    return PersistentBackend


def _torch_head() -> type:
    from switchyard.engine.backends.cuda.backend import CudaBackend

    class TorchHeadBackend(CudaBackend):
        name = "cuda-torch-head"

        def refine(self, raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int,
                   out: torch.Tensor | None = None) -> torch.Tensor:
            return TorchBackend.refine(self, raw, w, h, k)

    return TorchHeadBackend


def _chunk_refine() -> type:
    from chunk_refine import chunk_refine

    from switchyard.engine.backends.cuda.backend import CudaBackend

    class ChunkRefineBackend(CudaBackend):
        name = "cuda-chunk-refine"

        def refine(self, raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int,
                   out: torch.Tensor | None = None) -> torch.Tensor:
            if raw.device.type != "cuda" or raw.element_size() != 2:
                return super().refine(raw, w, h, k)
            return chunk_refine(raw, w, h, k, pdl=self.pdl)

    return ChunkRefineBackend


def _lazy(make_cls: object, *args: object) -> object:
    """A factory that builds its class on first use (the cuda backend imports triton)."""
    def factory(dims: ModelDims, layers: Sequence[LayerWeights]) -> object:
        return make_cls(*args)(dims, layers)  # type: ignore[operator]
    return factory


registry.register(IndexSdpaBackend.name, IndexSdpaBackend)
registry.register("cuda-prefill-flash", _lazy(_prefill_with, FLASH_PREFILL, "cuda-prefill-flash"))  # type: ignore[arg-type]
registry.register("cuda-prefill-cudnn", _lazy(_prefill_with, CUDNN_PREFILL, "cuda-prefill-cudnn"))  # type: ignore[arg-type]
registry.register("cuda-torch-glue", _lazy(_torch_glue))  # type: ignore[arg-type]
registry.register("cuda-attention-by-span", _lazy(_attention_shaped, "cuda-attention-by-span", _by_span))  # type: ignore[arg-type]
registry.register("cuda-no-pdl", _lazy(_no_pdl))  # type: ignore[arg-type]
registry.register("cuda-attention-unsplit", _lazy(_attention_shaped, "cuda-attention-unsplit", _unsplit))  # type: ignore[arg-type]
for _sp, _bn in ((1, 128), (1, 256), (2, 128), (4, 64), (8, 32), (8, 64), (16, 32)):
    _name = f"cuda-attention-{_sp}x{_bn}"
    registry.register(_name, _lazy(_attention_shaped, _name, functools.partial(_fixed, _sp, _bn)))  # type: ignore[arg-type]
registry.register("cuda-late-residual", _lazy(_late_residual))  # type: ignore[arg-type]
registry.register("cuda-torch-final", _lazy(_torch_final))  # type: ignore[arg-type]
registry.register("cuda-attention-early", _lazy(_attention_shaped, "cuda-attention-early", _served, True))  # type: ignore[arg-type]
registry.register("cuda-attention-late", _lazy(_attention_shaped, "cuda-attention-late", _served, False))  # type: ignore[arg-type]
registry.register("cuda-torch-head", _lazy(_torch_head))  # type: ignore[arg-type]
registry.register("cuda-chunk-refine", _lazy(_chunk_refine))  # type: ignore[arg-type]
registry.register("cuda-compiled-glue", _lazy(_compiled_glue))  # type: ignore[arg-type]
registry.register("cuda-torch-slots", _lazy(_step_cut, "cuda-torch-slots", False, True))  # type: ignore[arg-type]
registry.register("cuda-logits-copy", _lazy(_step_cut, "cuda-logits-copy", True, False))  # type: ignore[arg-type]
registry.register("cuda-head-cast", _lazy(_step_cut, "cuda-head-cast", True, True, False))  # type: ignore[arg-type]
registry.register("cuda-step-before", _lazy(_step_cut, "cuda-step-before", False, False, False))  # type: ignore[arg-type]
registry.register("cuda-persistent", _lazy(_persistent, "cuda-persistent", 4096))  # type: ignore[arg-type]
registry.register("cuda-persistent-2k", _lazy(_persistent, "cuda-persistent-2k", 2048))  # type: ignore[arg-type]
for _n in (0, 1, 2, 4, 8, 16):
    registry.register(f"cuda-fused-rows-{_n}", _lazy(_fused_rows, _n))  # type: ignore[arg-type]
for _spec in ONE_ROW_TILES:
    registry.register(f"cuda-1row-{_spec}", _lazy(_one_row_tiles, f"cuda-1row-{_spec}", _spec))  # type: ignore[arg-type]
