"""The `torch` backend: torch's ops, on any device and at any TP width. A GPU runs it where the
fused kernels do not (TP > 1, no triton, --decode-kernels torch), and the start-up check holds
the fused backend to it (model/warmup.py).

Numerics as a GPU wants them: weights, activations, queries, keys, values and the cache in the
model dtype; the residual stream, the norms and the softmax in float32. The elementwise groups
(torch_ops) run compiled inside CUDA graphs and in long prefills, eagerly elsewhere: a compiled
op costs ~0.1 ms of Python a call when it is not replayed, and only its fusion is left inside
a graph.

- Decode steps run in slot space (model/graph_runner.py): each row's blocks gathered into a
  contiguous span, then two batched matmuls around a fused masked softmax, which on an H200 beat
  memory-efficient SDPA for a handful of query rows per KV head (bench/engine_cuda_probe.py).
  A paged attention kernel would read the blocks in place (the cuda backend's does).
- Keys and values go into the cache as rows: one index_copy_ each over the cache viewed as rows
  (measured faster than advanced indexing on the per-slot cache before paging).
- Prefill from position 0: causal SDPA, cuDNN's kernel from 4096 prompt tokens (an 8B model's 8k
  prefill took 231-236 ms with it, 254-265 with flash attention, on an H200), flash attention
  below. A prompt whose start is cached attends over its gathered blocks with a mask
  (memory-efficient attention: flash attention takes no mask).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from switchyard.engine.backends import attention
from switchyard.engine.backends.base import EagerInput, LayerWeights, ModelDims, Plan, last_row_mask
from switchyard.engine.backends.torch_ops import Ops, rms_norm

COMPILED_PREFILL_TOKENS = 4096  # prefills at least this long use the compiled ops
CUDNN_PREFILL_TOKENS = 4096  # and cuDNN's attention
# The first kernel in the list that takes the shapes runs.
FLASH_PREFILL = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
CUDNN_PREFILL = [SDPBackend.CUDNN_ATTENTION, *FLASH_PREFILL]
MASKED_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # takes a mask and is capturable


@dataclass
class TorchPlan(Plan):
    ops: Ops  # compiled (inside graphs, long prefills) or eager
    pos: torch.Tensor  # [rows] positions
    w_blocks: torch.Tensor | None  # where each row's new key and value go: block ... (decode_slots)
    w_offs: torch.Tensor | None  # ... and position in it
    B: int  # rows of the step (decode: the slots it covers)
    T: int = 1
    decode: bool = False
    fused: bool = False  # a subclass's fused kernels run this step (the cuda backend's, up to 16 rows)
    ready: bool = False  # what every layer shares, made at the first layer (after the embedding)
    # decode
    tables: torch.Tensor | None = None  # [S, span / block_size]
    ctx: torch.Tensor | None = None  # [S] positions each row attends to
    L: int = 0  # the span
    bias: torch.Tensor | None = None  # [S, 1, 1, L] additive mask, float32
    head_in: torch.Tensor | None = None  # the final norm's rows in the model dtype too, where final() wrote them
    # eager
    lens: torch.Tensor | None = None  # [B] on the host
    sel: torch.Tensor | None = None  # the rows that are not padding (padding is not written)
    fresh: bool = True  # prompts from position 0; else one whose start is cached
    last: torch.Tensor | None = None  # each prompt's last row, on the device (what final() keeps)
    slots: torch.Tensor | None = None  # cuda backend: each row's cache slot (block * block_size + offset, -1: padding)
    keys_T: int = 0  # last_rows: each row a prompt's last, attending over the step's keys of this many rows
    span: torch.Tensor | None = None  # continued prompt: the blocks attended over ...
    mask: torch.Tensor | None = None  # ... causal from each position
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None


class TorchBackend:
    name = "torch"
    slot_decode = True
    chunked_prefill = False  # whole prompts a prefill step (a cached prefix is still skipped)

    def __init__(self, dims: ModelDims, layers: Sequence[LayerWeights], compile_ops: bool | None = None) -> None:
        d = self.d = dims
        self.ops = Ops(d.device, compile_ops)
        self.ops_eager = Ops(d.device, compile_ops=False)
        self.span_ids = torch.arange(-(-d.max_len // d.block_size) * d.block_size, device=d.device)
        self.head_rows = attention.head_rows(d.kv_heads, d.block_size, d.device)

    def kv_dtype(self, requested: str, fmt: str) -> torch.dtype:
        return self.d.dtype

    def status(self) -> dict[str, Any]:
        return {"decode_kernels": "torch", "prefill_kernels": "torch", "fused_ops": self.ops.status()}

    def warm(self, kc: torch.Tensor, vc: torch.Tensor, max_rows: int) -> None:
        """Nothing to compile per shape before serving."""

    # -- plans ---------------------------------------------------------------------------

    def plan(self, s: EagerInput) -> TorchPlan:
        dev, bs = self.d.device, self.d.block_size
        B, T = s.ids.shape
        positions, lens = s.positions.cpu(), s.lens.cpu()
        sel = (torch.arange(T).unsqueeze(0) < lens.unsqueeze(1)).view(-1).nonzero().view(-1)
        blocks = s.tables.gather(1, (positions // bs).clamp(max=s.tables.shape[1] - 1)).view(-1)[sel]
        offs = (positions.view(-1) % bs)[sel]
        p = TorchPlan(ids=s.ids, ops=self.ops if B * T >= COMPILED_PREFILL_TOKENS else self.ops_eager, pos=positions,
                      w_blocks=blocks.to(dev), w_offs=offs.to(dev), B=B, T=T, lens=lens, sel=sel.to(dev),
                      fresh=bool((positions[:, 0] == 0).all()))
        if not p.fresh:
            nb = -(-int(s.ctx_lens.max()) // bs)
            p.span = s.tables[:, :nb].to(dev)
            p.mask = (self.span_ids[: nb * bs].view(1, 1, -1) <= positions.to(dev).unsqueeze(-1)).unsqueeze(1)
        p.ids, p.pos = s.ids.to(dev).reshape(-1), positions.to(dev).reshape(-1)
        p.last = (torch.arange(B) * T + lens - 1).to(dev)  # here: a copy later in the step would wait for the GPU
        return p

    def decode_plan(self, ids: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor, tables: torch.Tensor, span: int,
                    graphs: bool) -> TorchPlan:
        S = ids.shape[0]
        w_blocks, w_offs = self.decode_slots(pos, tables)
        return TorchPlan(ids=ids, ops=self.ops if graphs else self.ops_eager, pos=pos, w_blocks=w_blocks,
                         w_offs=w_offs, B=S, decode=True, tables=tables, ctx=ctx, L=span)

    def decode_slots(self, pos: torch.Tensor, tables: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Where a decode step's rows write their new keys and values: (block, offset) of each
        row, or (None, None) where the step's kernels read them from the tables themselves."""
        bs = self.d.block_size
        return tables.gather(1, (pos // bs).view(-1, 1)).view(-1), pos % bs

    def _shared(self, p: TorchPlan) -> None:
        """Once a step, after the embedding: the rows' RoPE angles and the decode mask (every row
        sees at least position 0, so that an idle slot's softmax has no NaN)."""
        p.ready = True
        p.cos, p.sin = self.d.cos[p.pos], self.d.sin[p.pos]
        if p.decode:
            valid = self.span_ids[: p.L].unsqueeze(0) < p.ctx.clamp(min=1).unsqueeze(1)  # type: ignore[union-attr]
            p.bias = torch.zeros(p.B, 1, 1, p.L, dtype=torch.float32, device=self.d.device)
            p.bias.masked_fill_(~valid.view(p.B, 1, 1, p.L), float("-inf"))

    # -- a layer -------------------------------------------------------------------------

    def layer_in(self, layer: LayerWeights, kc: torch.Tensor, vc: torch.Tensor, x: torch.Tensor,
                 carry: torch.Tensor | None, p: TorchPlan) -> tuple[torch.Tensor, Any]:
        d = self.d
        if not p.ready:
            self._shared(p)
        if carry is None:
            h = rms_norm(x, layer.ln1, d.eps, d.dtype)
        else:
            x, h = p.ops.add_rms(x, carry, layer.ln1, d.eps, d.dtype)
        return x, self.project_qkv(layer, kc, vc, h, p)

    def project_qkv(self, layer: LayerWeights, kc: torch.Tensor, vc: torch.Tensor, h: torch.Tensor,
                    p: TorchPlan) -> Any:
        """QKV and RoPE of the normed rows h, the new keys and values written into the cache:
        what attention() takes as q."""
        q, k, v = self._rope(layer, h, p)
        if p.sel is None:
            self.write_kv(kc, vc, p.w_blocks, p.w_offs, k, v)
        else:
            self.write_kv(kc, vc, p.w_blocks, p.w_offs, k.index_select(0, p.sel), v.index_select(0, p.sel))
        return q, k, v

    def _rope(self, layer: LayerWeights, h: torch.Tensor,
              p: TorchPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d = self.d
        return p.ops.rope_qkv(layer.qkv(h), p.cos, p.sin, d.heads, d.kv_heads, d.head_dim, layer.q_norm, layer.k_norm,
                              d.eps, d.dtype)

    def write_kv(self, kc: torch.Tensor, vc: torch.Tensor, blocks: torch.Tensor, offs: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> None:
        attention.write_kv(kc, vc, blocks, offs, k, v, self.head_rows)

    def attention(self, q: Any, kc: torch.Tensor, vc: torch.Tensor, p: TorchPlan) -> torch.Tensor:
        """[rows, heads * head_dim] in the model dtype."""
        q, k, v = q
        H, Hkv, D = self.d.heads, self.d.kv_heads, self.d.head_dim
        if p.decode:
            return self.decode_attention(q, kc, vc, p).reshape(p.B, H * D)
        B, T = p.B, p.T
        q = q.view(B, T, H, D).transpose(1, 2)
        if p.fresh:
            Tk = p.keys_T or T
            k, v = k.view(B, Tk, Hkv, D).transpose(1, 2), v.view(B, Tk, Hkv, D).transpose(1, 2)
            kernels = self.prefill_kernels(B * T) if p.mask is None else MASKED_SDPA
            o = attention.prompt(q, k, v, p.mask, kernels, gqa=Hkv != H)
        else:
            k, v = attention.gather(kc, p.span), attention.gather(vc, p.span)  # type: ignore[arg-type]
            o = attention.prompt(q, k, v, p.mask, MASKED_SDPA, gqa=Hkv != H)
        return o.transpose(1, 2).reshape(B * T, H * D)

    def prefill_kernels(self, tokens: int) -> list[SDPBackend]:
        return CUDNN_PREFILL if tokens >= CUDNN_PREFILL_TOKENS else FLASH_PREFILL

    def decode_attention(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, p: TorchPlan) -> torch.Tensor:
        k, v = attention.gather(kc, p.tables), attention.gather(vc, p.tables)  # type: ignore[arg-type]
        return attention.decode(q, k, v, p.bias, p.ops.masked_softmax, self.d.dtype)  # type: ignore[arg-type]

    def layer_out(self, layer: LayerWeights, x: torch.Tensor, o: torch.Tensor,
                  p: TorchPlan) -> tuple[torch.Tensor, torch.Tensor | None]:
        d = self.d
        x, h = p.ops.add_rms(x, d.comm.all_reduce(layer.o(o)), layer.ln2, d.eps, d.dtype)
        return x, d.comm.all_reduce(layer.down(self.silu_mul(layer.gate_up(h), p)))

    def silu_mul(self, gu: torch.Tensor, p: TorchPlan) -> torch.Tensor:
        return p.ops.silu_mul(gu)

    def all_layers(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   p: TorchPlan) -> torch.Tensor | None:
        return None  # every layer through layer_in, attention, layer_out

    def last_rows(self, q: Any, x: torch.Tensor, p: TorchPlan) -> tuple[Any, torch.Tensor, TorchPlan] | None:
        """A prefill's last layer on each prompt's last row (its queries attend over every key before
        it): on the 8B shape's 8k prompt, the layer's o-projection, MLP and attention for one row,
        not 8,192 (~5 ms of kernels; 222.2 against 223.7 ms in wall on an H100, gpu_fill_lanes call 9)."""
        if p.decode or p.T == 1:
            return None
        B, T, dev = p.B, p.T, self.d.device
        rows = p.last
        assert rows is not None
        lens = rows - torch.arange(B, device=dev) * T + 1
        q, k, v = q
        n = copy.copy(p)
        n.T, n.ops = 1, self.ops_eager
        n.last = torch.arange(B, device=dev)
        if p.fresh:  # non-causal over the prompt's own keys, padding masked out
            n.keys_T = T
        n.mask = last_row_mask(p.fresh, lens, T, self.span_ids, p.mask)
        return (q.index_select(0, rows), k, v), x.index_select(0, rows), n

    def final(self, x: torch.Tensor, carry: torch.Tensor | None, norm: torch.Tensor, p: TorchPlan) -> torch.Tensor:
        """The last layer's residual add with the final norm (float32): every row of a decode
        step, each prompt's last row of a prefill."""
        if carry is None:
            h = rms_norm(x, norm, self.d.eps, torch.float32)
        else:
            _, h = p.ops.add_rms(x, carry, norm, self.d.eps, torch.float32)
        if p.decode:
            return h
        return h[p.last]

    # -- the logits' refinement ----------------------------------------------------------

    def refine(self, raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        logits = raw.float()
        top = logits.topk(k, dim=-1).indices
        return logits.scatter_(1, top, torch.bmm(w[top], h.contiguous().unsqueeze(-1)).squeeze(-1))
