"""The `cuda` backend: the torch backend with Triton kernels where they were measured faster on
an H200 (bench/results/engine_cuda_fused.md), on one rank (TP > 1 puts an all-reduce between a
projection and its residual add):

- a decode step of up to 16 rows (of one row on a model 4096 or more wide: fused_rows): each layer in five kernels (kernels.py: norm + QKV + RoPE + KV
  write, paged attention, o-proj + residual, norm + gate/up + SiLU, down + residual), launched
  with programmatic dependent launch on Hopper and later (each loads its weights while the one
  before it finishes);
- a larger decode step: cuBLAS for the projections and Triton kernels for the residual add + norm
  and SiLU (prefill_kernels: torch's compiled dynamic-shape ops took twice as long, 3.7-4.3% of an
  8B step at 16-64 rows on an H100, bench/results/gpu_peer_8b/), with RoPE and the KV write in one
  kernel after the QKV projection (kernels.rope_write:
  torch's RoPE, the rows' cache indices and two index copies took ~20 us a layer of an 8B step at
  64 rows, bench/results/gpu_b64/), and attention reading the cache in place with the paged
  kernel (gathering each row's blocks first cost an 8B step at batch 256 ~17 GB of copies);
- a prefill: RoPE (with the QKV split and the KV write), SiLU and the residual add + norm in Triton
  kernels (prefill_kernels.py), torch's SDPA for attention; with --prefill-fp8, a prefill of at
  least fp8.PREFILL_TOKENS tokens runs its projections on the layers' FP8 copies (fp8.py:
  activations quantised per token, _scaled_mm).

Without a GPU the kernels run in Triton's interpreter (the CPU tests). Whether they compute what
the torch backend computes is checked at start-up (model/warmup.py).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from switchyard.engine.backends.base import EagerInput, LayerWeights, ModelDims
from switchyard.engine.backends.cuda import fp8
from switchyard.engine.backends.cuda import head_kernels as hk
from switchyard.engine.backends.cuda import kernels as ck
from switchyard.engine.backends.cuda import prefill_kernels as pk
from switchyard.engine.backends.cuda.graphs import BATCH_BUCKETS, batch_bucket, len_bucket
from switchyard.engine.backends.cuda.triton_common import pdl_supported
from switchyard.engine.backends.torch_backend import TorchBackend, TorchPlan

MAX_FUSED_ROWS = ck.MAX_ROWS
# A model this wide runs the fused layers at one row only. On an H200 (bench/results/gpu_b64/call4)
# the cuBLAS path with rope_write ran the 8B shape's (hidden 4096) steps of 2-16 rows in 0.97-0.98x
# the fused layers' time, while SmolLM2's (hidden 576) fused layers took 0.63-0.90x the cuBLAS
# path's at 1, 4 and 16 rows: the wide model's projections are weight reads that cuBLAS streams as
# well at a few rows, the narrow one's are launches. Between the two widths it is unmeasured.
WIDE_HIDDEN = 4096


def fused_rows(hidden: int) -> int:
    """The rows up to which a decode step of a model `hidden` wide runs the fused layers."""
    return 1 if hidden >= WIDE_HIDDEN else MAX_FUSED_ROWS


class CudaBackend(TorchBackend):
    name = "cuda"
    TRITON_GLUE = True  # a decode step past the fused rows: norms and SiLU by Triton (False: torch's compiled ops)
    SLOTS_FROM_TABLES = True  # a fused decode step's KV slots read by its QKV kernels from the tables (False: torch's ops)
    PREFILL_GLUE = True  # a prefill's KV write in rope_split, its add + norm by Triton (False: the torch backend's)

    def __init__(self, dims: ModelDims, layers: Sequence[LayerWeights], compile_ops: bool | None = None) -> None:
        super().__init__(dims, layers, compile_ops)
        self.layers = layers  # whether they carry FP8 copies (--prefill-fp8) is status()'s to say
        # The decode kernels launch with programmatic dependent launch where the GPU has it: each
        # loads its weights while the kernel before it finishes (triton_common.pdl_supported).
        self.pdl = pdl_supported(dims.device)
        # The split attention's counters (paged_attention): zeros it leaves at zero, one buffer for
        # every launch and every captured graph (a batch bucket's rows x kv heads at most).
        self.counters = torch.zeros(BATCH_BUCKETS[-1] * dims.kv_heads, dtype=torch.int32, device=dims.device)
        # A decode step past the fused rows uses two of its ops, the residual add + RMSNorm and SiLU * up
        # (RoPE is rope_write's, attention the paged kernel's): those as prefill_kernels' Triton kernels.
        self.glue_ops = copy.copy(self.ops)
        self.glue_ops.add_rms, self.glue_ops.silu_mul = pk.add_rms, pk.silu_mul  # type: ignore[assignment]

    def status(self) -> dict[str, Any]:
        # one switch: the prefill's RoPE and SiLU kernels go with the decode kernels
        st = {**super().status(), "decode_kernels": "fused", "prefill_kernels": "fused",
              "fused_rows": fused_rows(self.d.hidden), "pdl": self.pdl, "prefill_fp8": fp8.carried(self.layers)}
        if st["prefill_fp8"]:
            st["prefill_fp8_tokens"] = fp8.PREFILL_TOKENS
        return st

    def _fp8(self, p: TorchPlan) -> bool:
        """Whether this step's projections run on their FP8 copies (where they have one): a
        prefill of at least fp8.PREFILL_TOKENS tokens. Decode never does."""
        return not p.decode and p.B * p.T >= fp8.PREFILL_TOKENS

    def plan(self, s: EagerInput) -> TorchPlan:
        """The torch backend's prefill plan, with each row's cache slot for rope_split (which writes
        the keys and values) and the Triton residual add + norm (glue_ops) at any length."""
        p = super().plan(s)
        if not self.PREFILL_GLUE:
            return p
        p.ops = self.glue_ops
        slots = p.w_blocks * self.d.block_size + p.w_offs  # type: ignore[operator]
        p.slots = slots if slots.numel() == p.B * p.T else torch.full(
            (p.B * p.T,), -1, dtype=slots.dtype, device=slots.device).index_copy_(0, p.sel, slots)  # type: ignore[arg-type]
        return p

    def decode_plan(self, ids: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor, tables: torch.Tensor, span: int,
                    graphs: bool) -> TorchPlan:
        p = super().decode_plan(ids, pos, ctx, tables, span, graphs)
        p.fused = fused_rows(self.d.hidden) >= p.B
        if not p.fused and self.TRITON_GLUE:
            p.ops = self.glue_ops
        return p

    def decode_slots(self, pos: torch.Tensor, tables: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.SLOTS_FROM_TABLES and fused_rows(self.d.hidden) >= pos.shape[0]:
            return None, None  # the fused QKV kernel reads each row's slot from its table (kernels.qkv_rope)
        return super().decode_slots(pos, tables)

    def _shared(self, p: TorchPlan) -> None:
        # The decode kernels and the prefill's RoPE kernel read the whole tables at each row's
        # position, and the paged kernel takes no mask: nothing to gather once a step.
        p.ready = True

    def layer_in(self, layer: LayerWeights, kc: torch.Tensor, vc: torch.Tensor, x: torch.Tensor,
                 carry: torch.Tensor | None, p: TorchPlan) -> tuple[torch.Tensor, Any]:
        if p.fused:
            d = self.d
            return x, ck.qkv_rope(x, layer.ln1, layer.qkv.w, layer.qkv.b, layer.qk_norm, d.cos, d.sin, p.pos,
                                  p.w_blocks, p.w_offs, kc, vc, d.heads, d.kv_heads, d.eps, pdl=self.pdl,
                                  tables=p.tables)
        return super().layer_in(layer, kc, vc, x, carry, p)

    def project_qkv(self, layer: LayerWeights, kc: torch.Tensor, vc: torch.Tensor, h: torch.Tensor,
                    p: TorchPlan) -> Any:
        if not p.decode:
            if p.slots is None:  # PREFILL_GLUE off: the torch backend's KV write
                return super().project_qkv(layer, kc, vc, h, p)
            return self._rope(layer, h, p, cache=(kc, vc, p.slots))
        d = self.d
        return ck.rope_write(layer.qkv(h), layer.qk_norm, d.cos, d.sin, p.pos, p.w_blocks, p.w_offs, kc, vc, d.heads,
                             d.kv_heads, d.eps, pdl=self.pdl)

    def _rope(self, layer: LayerWeights, h: torch.Tensor, p: TorchPlan,
              cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d = self.d
        qkv = fp8.project(layer.qkv, h) if self._fp8(p) else layer.qkv(h)
        return pk.rope_split(qkv, d.cos, d.sin, p.pos, d.heads, d.kv_heads, d.head_dim, layer.qk_norm, d.eps, cache)

    def attention(self, q: Any, kc: torch.Tensor, vc: torch.Tensor, p: TorchPlan) -> torch.Tensor:
        if not p.decode:
            return super().attention(q, kc, vc, p)
        return ck.paged_attention(q, kc, vc, p.tables, p.ctx, p.L, pdl=self.pdl, counters=self.counters)

    def layer_out(self, layer: LayerWeights, x: torch.Tensor, o: torch.Tensor,
                  p: TorchPlan) -> tuple[torch.Tensor, torch.Tensor | None]:
        if p.fused:
            x = ck.gemv_residual(o, layer.o.w, x, pdl=self.pdl, x_ready=True)  # x: before qkv_rope
            h = ck.gate_up_silu(x, layer.ln2, layer.gate_up.w, self.d.eps, pdl=self.pdl)
            return ck.gemv_residual(h, layer.down.w, x, pdl=self.pdl, x_ready=True), None  # x: before gate_up
        if self._fp8(p):  # the torch backend's layer_out on FP8 copies; one rank: no all-reduce
            d = self.d
            x, h = p.ops.add_rms(x, fp8.project(layer.o, o), layer.ln2, d.eps, d.dtype)
            return x, fp8.mlp(layer.gate_up, layer.down, h)
        return super().layer_out(layer, x, o, p)

    def final(self, x: torch.Tensor, carry: torch.Tensor | None, norm: torch.Tensor, p: TorchPlan) -> torch.Tensor:
        if p.fused:  # no carry: the fused layers added their own residual
            if self.d.dtype != torch.float32:  # the LM head's input, in the same launch (Decoder.logits)
                p.head_in = torch.empty(x.shape, dtype=self.d.dtype, device=x.device)
            return pk.rms_norm(x, norm, self.d.eps, torch.float32, low=p.head_in)
        return super().final(x, carry, norm, p)

    def refine(self, raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        # Triton's interpreter sorts a row in ~0.3 s (the kernels' own test checks them there); an
        # int4 head's float32 logits take torch's path
        if raw.device.type != "cuda" or raw.element_size() != 2:
            return super().refine(raw, w, h, k)
        return hk.refine(raw, w, h, k, pdl=self.pdl, out=out)

    def silu_mul(self, gu: torch.Tensor, p: TorchPlan) -> torch.Tensor:
        return super().silu_mul(gu, p) if p.decode else pk.silu_mul(gu)  # decode: p.ops's (glue_ops)

    def warm(self, kc: torch.Tensor, vc: torch.Tensor, max_rows: int) -> None:
        """The attention kernel is compiled once per launch shape (its split count and chunk are
        constants, set by the span bucket and the step's rows): compile every shape of a decode
        step's batch buckets now, reading the spare block only, rather than on the step whose
        context first crosses into a bucket."""
        d = self.d
        if d.device.type != "cuda":
            return
        q = torch.zeros(1, d.heads, d.head_dim, dtype=d.dtype, device=d.device)
        ctx = torch.ones(1, dtype=torch.int64, device=d.device)
        rows = {batch_bucket(b, max_rows) for b in BATCH_BUCKETS if b <= max_rows} | {max_rows}
        longest = 1
        while longest < d.max_len:
            longest = len_bucket(longest + 1, d.max_len)
            span = -(-longest // d.block_size) * d.block_size  # as the graph runner rounds it
            tables = torch.full((1, span // d.block_size), d.num_blocks, dtype=torch.int64, device=d.device)
            for splits, block_n in sorted({ck.attention_shape(span, r * d.kv_heads) for r in rows}):
                ck.paged_attention(q, kc, vc, tables, ctx, span, block_n, splits, pdl=self.pdl, counters=self.counters)
