"""The `cpu` backend: our native kernels (native/) where this CPU, a C compiler and the shapes
allow, torch's ops where not; float32 attention over a float32 or float16 cache.

- One rank with int4 weights on our kernels: each layer's work around its attention is two
  native calls (native/layer.c: norm + QKV + RoPE; o-proj + residual + norm + MLP), bit-identical
  to the op-by-op path, with their buffers kept between steps (no allocation, no page faults).
- Otherwise op by op: the projections as their format runs them (model/linear.py), RMSNorm with
  the residual add, SwiGLU and RoPE natively on float32 rows (rowops.py), else torch's.
- Decode attention natively, the KV write with it, on the projection's rows as they are; a
  prefill (or a decode the kernel cannot take) writes the cache and attends in torch
  (backends/attention.py: SDPA, over the cached blocks when the prompt's start is cached).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from switchyard.engine.backends import attention
from switchyard.engine.backends.base import EagerInput, LayerWeights, ModelDims, Plan, last_row_mask
from switchyard.engine.backends.cpu.native import load as load_native
from switchyard.engine.backends.cpu.rowops import RowOps
from switchyard.engine.backends.torch_ops import masked_softmax, rotate
from switchyard.engine.errors import KernelError

_LAYER_ERRORS = {1: "shape unsupported", 2: "position outside the cache", 3: "out of memory"}
_ATTN_ERRORS = {1: "head shape or block size unsupported", 2: "block or position outside the cache", 3: "out of memory"}


def resolve_kv_dtype(requested: str, fmt: str, native_attention: bool) -> torch.dtype:
    """`auto`: float16 when the weights are int4 and the native decode attention reads the
    cache (at batch 16 the float32 cache was read at ~12 GB/s, 4-5 ms of a ~20 ms step);
    float32 otherwise, and always with float32 weights, where the engine is exact. (Options
    checked the name: runner/options.py.)"""
    if requested == "auto":
        return torch.float16 if fmt == "int4" and native_attention else torch.float32
    return getattr(torch, requested)


@dataclass
class CpuPlan(Plan):
    """What every layer's attention in one step shares, worked out once a step."""

    B: int
    T: int
    positions: torch.Tensor  # [B, T]
    tables: torch.Tensor  # [B, W] block ids, contiguous int64
    lens: torch.Tensor  # [B] new tokens per row
    fresh: bool  # decode, or prompts from position 0; else a continued prompt (cached start)
    threads: int = 1
    pos_flat: torch.Tensor | None = None  # decode: [B] positions
    scale: float = 1.0
    L: int = 0  # positions attended over, whole blocks (torch's decode path, continued prompts)
    valid: torch.Tensor | None = None  # prefill: [B, T] rows that are not padding
    w_blocks: torch.Tensor | None = None  # where the new keys and values go: blocks ...
    w_offs: torch.Tensor | None = None  # ... and positions inside them
    mask: torch.Tensor | None = None  # continued prompts: [B, 1, T, L] causal over the cache
    keys_T: int = 0  # last_rows: each row a prompt's last query, over the step's keys of this many rows
    bias: torch.Tensor | None = None  # torch's decode path: [B, 1, 1, L] additive mask
    cos: torch.Tensor | None = None  # torch's RoPE, filled on first use
    sin: torch.Tensor | None = None
    ws: list[torch.Tensor] | None = None  # the fused layers' buffers: h, qkv, t, gu, act, delta
    ptr: list[int] | None = None  # ... and their addresses


class CpuBackend:
    name = "cpu"
    slot_decode = False
    chunked_prefill = True  # a prefill step may continue a prompt whose start is already cached

    def __init__(self, dims: ModelDims, layers: Sequence[LayerWeights]) -> None:
        d = self.d = dims
        self.lib, _ = load_native()
        lib = self.lib
        fits = (d.head_dim % 16 == 0 and d.head_dim <= 256 and d.heads // max(1, d.kv_heads) <= 16
                and d.block_size % 16 == 0)
        self.attn = lib.sy_decode_attn if lib is not None and fits else None
        self.ops = RowOps(lib, d.cos, d.sin)
        self.head_rows = attention.head_rows(d.kv_heads, d.block_size, d.device)
        # int4 weights on our kernels (Int4.weight is what native/layer.c takes), one rank, no q/k norm.
        self.fused = (lib is not None and d.tp == 1 and d.hidden % 16 == 0 and all(
            layer.q_norm is None and all(getattr(proj, "weight", None) is not None
                                         for proj in (layer.qkv, layer.o, layer.gate_up, layer.down))
            for layer in layers))
        self._ws = torch.empty(0)
        self._sizes = (layers[0].qkv.n, layers[0].down.k) if self.fused and layers else (0, 0)  # QKV width, MLP

    def kv_dtype(self, requested: str, fmt: str) -> torch.dtype:
        return resolve_kv_dtype(requested, fmt, self.attn is not None)

    def status(self) -> dict[str, Any]:
        return {}

    def warm(self, kc: torch.Tensor, vc: torch.Tensor, max_rows: int) -> None:
        """The native kernels are built when loaded."""

    def decode_plan(self, ids: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor, tables: torch.Tensor, span: int,
                    graphs: bool) -> Plan:
        raise NotImplementedError("the cpu backend decodes eagerly (slot_decode is False)")

    def plan(self, s: EagerInput) -> CpuPlan:
        B, T = s.positions.shape
        bs = self.d.block_size
        positions, tables = s.positions, s.tables
        p = CpuPlan(s.ids, B, T, positions, tables, s.lens, T == 1 or bool((positions[:, 0] == 0).all()))
        if T == 1:
            p.pos_flat = positions[:, 0].contiguous()
            p.scale = 1.0 / math.sqrt(self.d.head_dim)
        if T > 1 or self.attn is None:
            # Where this step's keys and values go; right padding is not written (its positions
            # may lie past the row's blocks).
            p.valid = torch.arange(T).unsqueeze(0) < s.lens.unsqueeze(1)
            blocks = tables.gather(1, (positions // bs).clamp(max=tables.shape[1] - 1))
            p.w_blocks, p.w_offs = blocks[p.valid], (positions % bs)[p.valid]
        if T == 1 and self.attn is None or not p.fresh:
            L = p.L = -(-int(s.ctx_lens.max()) // bs) * bs
            if T == 1:
                p.bias = torch.where(torch.arange(L) < s.ctx_lens.unsqueeze(1), 0.0, float("-inf")).view(B, 1, 1, L)
            else:
                p.mask = (torch.arange(L).view(1, 1, L) <= positions.unsqueeze(-1)).unsqueeze(1)
        if self.fused:
            self._workspace(p)
        return p

    def _workspace(self, p: CpuPlan) -> None:
        M, D = p.B * p.T, self.d.hidden
        n_qkv, inter = self._sizes
        sizes = (M * D, M * n_qkv, M * D, M * 2 * inter, M * inter, M * D)  # h, qkv, t, gu, act, delta
        if self._ws.numel() < sum(sizes):  # kept between steps: no allocation, no page faults
            self._ws = torch.empty(sum(sizes))
        p.ws = list(self._ws[:sum(sizes)].split(sizes))
        p.ptr = [t.data_ptr() for t in p.ws]
        p.threads = torch.get_num_threads()
        p.positions = p.positions.contiguous()

    # -- a layer -------------------------------------------------------------------------

    def layer_in(self, layer: LayerWeights, kc: torch.Tensor, vc: torch.Tensor, x: torch.Tensor,
                 carry: torch.Tensor | None, p: CpuPlan) -> tuple[torch.Tensor, Any]:
        """Returns the QKV rows rotated in place [B, T, width], or (q, k, v) rotated in torch."""
        d, ops = self.d, self.ops
        if self.fused:
            assert p.ptr is not None and p.ws is not None
            bias = layer.qkv.b
            rc = self.lib.sy_layer_in(x.data_ptr(), None if carry is None else p.ptr[5], layer.ln1.data_ptr(), d.eps,
                                      layer.qkv.weight, None if bias is None else bias.data_ptr(), p.ptr[0], p.ptr[1],
                                      p.B * p.T, d.heads + d.kv_heads, d.head_dim, d.cos.data_ptr(), d.sin.data_ptr(),
                                      p.positions.data_ptr(), d.max_len, p.threads)
            if rc:
                raise KernelError(f"native layer (norm, QKV, RoPE) failed: {_LAYER_ERRORS.get(rc, rc)}")
            return x, p.ws[1].view(p.B, p.T, -1)
        if carry is None:
            h = ops.rms_norm(x, layer.ln1, d.eps, d.dtype)
        else:
            h = ops.add_rms_norm(x, carry, layer.ln1, d.eps, d.dtype)
        qkv = layer.qkv(h).float()  # attention and the KV cache stay in float32
        if layer.q_norm is None and ops.rope_(qkv, p.positions, d.heads + d.kv_heads, d.head_dim):
            return x, qkv
        B, T, H, Hkv, D = p.B, p.T, d.heads, d.kv_heads, d.head_dim
        q, k, v = qkv.split((d.q_size, d.kv_size, d.kv_size), dim=-1)
        q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        if layer.q_norm is not None:
            q = ops.rms_norm(q, layer.q_norm, d.eps)
            k = ops.rms_norm(k, layer.k_norm, d.eps)  # type: ignore[arg-type]
        if p.cos is None:
            p.cos, p.sin = d.cos[p.positions].unsqueeze(2), d.sin[p.positions].unsqueeze(2)
        return x, (rotate(q, p.cos, p.sin), rotate(k, p.cos, p.sin), v)

    def attention(self, q: Any, kc: torch.Tensor, vc: torch.Tensor, p: CpuPlan) -> torch.Tensor:
        """[B, T, heads * head_dim] float32: decode (native or torch), a fresh prefill, or a later
        chunk of a prompt."""
        d = self.d
        if p.keys_T:
            return self._last_rows_attention(q, kc, vc, p)
        if isinstance(q, torch.Tensor):
            if p.T == 1 and self.attn is not None:  # the usual decode step: no views, no copies
                return self._native(q, kc, vc, p)
            B, T = p.B, p.T
            q, k, v = q.split((d.q_size, d.kv_size, d.kv_size), dim=-1)
            q, k, v = q.view(B, T, d.heads, d.head_dim), k.view(B, T, d.kv_heads, d.head_dim), \
                v.view(B, T, d.kv_heads, d.head_dim)
        else:
            q, k, v = q
            if p.T == 1 and self.attn is not None:
                return self._native(torch.cat((q.flatten(2), k.flatten(2), v.flatten(2)), dim=-1), kc, vc, p)
        B, T, H, D = p.B, p.T, d.heads, d.head_dim
        attention.write_kv(kc, vc, p.w_blocks, p.w_offs, k[p.valid].to(kc.dtype), v[p.valid].to(vc.dtype),  # type: ignore[arg-type]
                           self.head_rows)
        if T == 1:
            k, v = self._span(kc, p), self._span(vc, p)
            return attention.decode(q[:, 0], k, v, p.bias, masked_softmax, torch.float32).reshape(B, T, H * D)  # type: ignore[arg-type]
        q = q.transpose(1, 2)
        if p.fresh:  # prompts from position 0: attend over their own keys and values
            o = attention.prompt(q, k.transpose(1, 2), v.transpose(1, 2), None)
        else:
            # A prompt whose start is cached (an earlier chunk, or a prefix another sequence
            # computed): attend over its blocks so far, causal from each position.
            o = attention.prompt(q, self._span(kc, p), self._span(vc, p), p.mask)
        return o.transpose(1, 2).reshape(B, T, d.q_size)

    def _last_rows_attention(self, q: Any, kc: torch.Tensor, vc: torch.Tensor, p: CpuPlan) -> torch.Tensor:
        """last_rows' attention: the step's keys and values written, each prompt's last query over them."""
        q, k, v = q
        attention.write_kv(kc, vc, p.w_blocks, p.w_offs, k[p.valid].to(kc.dtype), v[p.valid].to(vc.dtype),  # type: ignore[arg-type]
                           self.head_rows)
        if p.fresh:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        else:
            k, v = self._span(kc, p), self._span(vc, p)
        o = attention.prompt(q.transpose(1, 2), k, v, p.mask)
        return o.transpose(1, 2).reshape(p.B, 1, self.d.q_size)

    def _native(self, qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, p: CpuPlan) -> torch.Tensor:
        """Write this step's keys and values into their blocks and attend, in one native call,
        on the projection's rows as they are (queries, keys, values side by side)."""
        d = self.d
        B = qkv.shape[0]
        qkv = qkv.contiguous()
        out = qkv.new_empty(B, 1, d.q_size)
        tables = p.tables
        rc = self.attn(qkv.data_ptr(), kc.data_ptr(), vc.data_ptr(), tables.data_ptr(), tables.shape[1],  # type: ignore[misc]
                       p.pos_flat.data_ptr(), B, d.heads, d.kv_heads, d.head_dim, d.num_blocks, d.block_size,  # type: ignore[union-attr]
                       p.scale, out.data_ptr(), torch.get_num_threads(), int(kc.dtype == torch.float16))
        if rc:
            raise KernelError(f"native decode attention failed: {_ATTN_ERRORS.get(rc, rc)}")
        return out

    def _span(self, cache: torch.Tensor, p: CpuPlan) -> torch.Tensor:
        """The step's sequences' first L positions of one layer's cache: [B, kv_heads, L, head_dim], float32."""
        return attention.gather(cache, p.tables[:, : p.L // self.d.block_size]).float()

    def layer_out(self, layer: LayerWeights, x: torch.Tensor, o: torch.Tensor,
                  p: CpuPlan) -> tuple[torch.Tensor, torch.Tensor | None]:
        d, ops = self.d, self.ops
        if self.fused:
            assert p.ptr is not None and p.ws is not None
            o = o.contiguous()
            rc = self.lib.sy_layer_out(o.data_ptr(), x.data_ptr(), layer.ln2.data_ptr(), d.eps, layer.o.weight,
                                       layer.gate_up.weight, layer.down.weight, p.ptr[2], p.ptr[0], p.ptr[3], p.ptr[4],
                                       p.ptr[5], p.B * p.T, p.threads)
            if rc:
                raise KernelError(f"native layer (output, norm, MLP) failed: {_LAYER_ERRORS.get(rc, rc)}")
            return x, p.ws[5]
        o = o.to(d.dtype)
        h = ops.add_rms_norm(x, d.comm.all_reduce(layer.o(o)).float(), layer.ln2, d.eps, d.dtype)
        return x, d.comm.all_reduce(layer.down(ops.silu_mul(layer.gate_up(h)))).float()

    def all_layers(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   p: CpuPlan) -> torch.Tensor | None:
        return None  # every layer through layer_in, attention, layer_out

    def last_rows(self, q: Any, x: torch.Tensor, p: CpuPlan) -> tuple[Any, torch.Tensor, CpuPlan] | None:
        """A prefill's last layer on each prompt's last row: its queries, its residual rows and a plan
        of one row a prompt whose attention still writes the whole step's keys and values (this backend
        writes a layer's cache there) and attends over them (fresh prompts, padding masked) or over the
        cache (a continued prompt, its last row's causal mask)."""
        if p.T == 1:
            return None
        d, B, T = self.d, p.B, p.T
        if isinstance(q, torch.Tensor):  # the QKV rows side by side
            q, k, v = q.split((d.q_size, d.kv_size, d.kv_size), dim=-1)
            q, k, v = (q.view(B, T, d.heads, d.head_dim), k.view(B, T, d.kv_heads, d.head_dim),
                       v.view(B, T, d.kv_heads, d.head_dim))
        else:
            q, k, v = q
        rows, last = torch.arange(B), p.lens - 1
        n = copy.copy(p)
        n.T, n.keys_T, n.lens = 1, T, torch.ones_like(p.lens)
        n.mask = last_row_mask(p.fresh, p.lens, T, torch.arange(T), p.mask)
        if self.fused:  # the fused layer_out's buffers laid out for B rows (k and v are read before it writes)
            self._workspace(n)
        return (q[rows, last].unsqueeze(1), k, v), x[rows, last].unsqueeze(1).contiguous(), n

    def final(self, x: torch.Tensor, carry: torch.Tensor | None, norm: torch.Tensor, p: CpuPlan) -> torch.Tensor:
        """The last layer's residual add, then each row's last new token, normed."""
        if carry is not None:
            x.add_(carry.view_as(x))
        return self.ops.rms_norm(x[torch.arange(p.B), p.lens - 1], norm, self.d.eps)

    # -- the logits' refinement ----------------------------------------------------------

    def refine(self, raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        logits = raw.float()
        top = self.ops.topk(logits, k)
        return logits.scatter_(1, top, self.ops.gather_dot(w, h.contiguous(), top))
