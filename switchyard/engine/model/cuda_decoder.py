"""The tensor-parallel decoder on a GPU: bf16 weights and KV cache, decode steps replayed
as CUDA graphs.

Same sharding, interface and numerics choices as model.TPModel (float32 residual stream,
float32 embedding, exact float32 logits for the top candidates), different execution:

- The KV cache is paged like the CPU model's: [blocks + 1, kv_heads, block_size, head_dim] per
  layer, the step's block tables saying which blocks hold each sequence's positions. The
  extra block (index num_blocks) is a spare that only idle decode rows write to.
- Decode runs in slot space: a step covers decode slots 0..S-1 (S = a batch bucket >= the
  highest live slot + 1), so shapes depend only on (S, context bucket) and the step can be
  captured once per bucket. Slots not in the step write their K/V into the spare block, which
  no live row attends to, and their logits are dropped.
- The step reads token ids, positions, context lengths and block tables from static device
  buffers and writes logits into a static buffer: no host synchronisation inside a step, two
  small host-to-device copies before it and one gather after it.
- Decode attention: each row's blocks gathered into a contiguous span, then two batched
  matmuls around a fused masked softmax, which on an H200 beat memory-efficient SDPA for a
  handful of query rows per KV head (SDPA kept as a variant). The gather copies what the old
  per-slot cache's reshape copied; a paged attention kernel (FlashInfer, flash-attn's
  block_table) would read the blocks in place.
- Prefill is eager (its shapes vary): causal SDPA (flash attention on GPU) for prompts from
  position 0; a prompt whose start is cached (prefix caching) attends over its gathered blocks
  with a mask.

It also runs on CPU (eagerly, graphs off), which is how CI checks it against TPModel.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from switchyard.engine.backends.cuda.device import have_triton
from switchyard.engine.backends.cuda.graphs import DecodeGraphs, batch_bucket, len_bucket
from switchyard.engine.backends.cuda.ops import Ops, rms_norm
from switchyard.engine.model.common import REFINE, embed_tokens, rope_inv_freq, rope_tables
from switchyard.engine.model.config import ModelConfig
from switchyard.engine.model.cuda_layer import CudaLayer
from switchyard.engine.model.parallel import CollectiveBackend
from switchyard.engine.model.step import Step
from switchyard.engine.model.weights import Shard

MAX_FUSED_ROWS = 16  # cuda_kernels.MAX_ROWS, without importing triton here
log = logging.getLogger("switchyard.engine.model.cuda_decoder")
COMPILED_PREFILL_TOKENS = 4096  # prefills at least this long use the fused (compiled) ops
# Decode attention has a padding mask; flash attention takes none. Memory-efficient
# attention takes one and is capturable; math is the CPU path.
_DECODE_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# Prefill from position 0: causal, no mask. cuDNN's kernel is an option to measure against
# flash attention on Hopper (CudaModel.prefill_sdpa); the first one that takes the shapes runs.
PREFILL_SDPA = {"flash": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
                "cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                          SDPBackend.MATH]}


class CudaModel:
    """One rank's shard on a device, with the same forward() contract as TPModel."""

    chunked_prefill = False  # whole prompts a prefill step (a cached prefix is still skipped)

    def __init__(self, config: ModelConfig, shard: Shard, weights: dict[str, torch.Tensor],
                 comm: CollectiveBackend, max_slots: int, max_len: int,
                 device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
                 cuda_graphs: bool = True, compile_ops: bool | None = None, block_size: int = 16,
                 num_blocks: int = 0, decode_kernels: str = "auto") -> None:
        dev = torch.device(device)
        self.c, self.shard, self.comm, self.device, self.dtype = config, shard, comm, dev, dtype
        self.heads, self.kv_heads, self.hd = shard.heads, shard.kv_heads, config.head_dim
        self.vocab_lo, self.vocab_hi = shard.vocab_rows
        self.embed = weights["embed_tokens.weight"].to(device=dev, dtype=torch.float32).contiguous()
        head = weights.get("lm_head.weight")
        self.lm_head = self.embed if head is None else head.to(device=dev, dtype=torch.float32).contiguous()
        # Logits for the whole vocabulary at the matmul dtype, then the best few in float32
        # (greedy choices and top logprobs as exact as the CPU engine's).
        self.lm_head_lowp = None if dtype == torch.float32 else self.lm_head.to(dtype)
        self.norm = weights["norm.weight"].to(device=dev, dtype=torch.float32)
        self.layers = [CudaLayer(weights, f"layers.{i}.", dev, dtype) for i in range(config.num_layers)]
        self.inv_freq = rope_inv_freq(config, weights.get("rope_freqs"))
        # Compiled ops cost ~0.1 ms of Python per call when run eagerly; inside a CUDA graph that
        # cost is gone and only their fusion remains. So: compiled inside graphs and for long
        # prefills (where fusion saves memory traffic), plain torch ops elsewhere.
        self.ops = Ops(dev, compile_ops)
        self.ops_eager = Ops(dev, compile_ops=False)
        self._ops = self.ops
        # Decode-step variants, measured on an H200 (bench/engine_cuda_probe.py, on the per-slot
        # cache before paging): how K/V are written into the cache and which attention kernel reads it.
        self.kv_write = "scatter"  # scatter (index_copy_ of cache rows) | index (advanced indexing)
        self.attn_impl = "bmm"  # bmm | sdpa (memory-efficient kernel: slower for one query row)
        self.graph_parts = 4  # decode graphs per step (see _decode_core): measured best on an H200
        # fused: each layer in five Triton kernels (cuda_kernels) for steps of up to 16 rows on
        # one rank, checked against the torch ops at warm-up, and the prefill's RoPE and SiLU in
        # Triton kernels too; torch: the ops above (larger steps, TP > 1, no triton). auto: fused
        # on a GPU (measured faster at batch 1-16 on an H200, bench/results/engine_cuda_fused.md),
        # torch on a CPU, where Triton only interprets.
        if decode_kernels not in ("auto", "fused", "torch"):
            raise ValueError(f"decode_kernels must be 'auto', 'fused' or 'torch', got {decode_kernels!r}")
        self.decode_impl, self.decode_reason = "torch", ""
        if decode_kernels == "fused" or (decode_kernels == "auto" and dev.type == "cuda"):
            if shard.tp > 1:
                self.decode_reason = "fused decode kernels run on one rank only (TP > 1 all-reduces mid-layer)"
            elif not have_triton():
                self.decode_reason = "fused decode kernels need triton"
            else:
                self.decode_impl = "fused"
        # A key of PREFILL_SDPA, or auto: cuDNN's attention from 4096 prompt tokens (an 8B model's
        # 8k prefill took 231-236 ms with it, 254-265 with flash, on an H200), flash below.
        self.prefill_sdpa = "auto"
        # A decode step's largest all-reduce: the embedding rows, float32, per batch slot.
        self.graphs = DecodeGraphs(self._decode_core, dev, cuda_graphs,
                                   capturable=lambda batch: comm.graph_safe(batch * config.hidden_size * 4))
        self.max_slots = self.max_len = 0
        self.block_size = block_size
        self.allocate_cache(max_slots, max_len, num_blocks)

    # -- memory --------------------------------------------------------------------------

    def allocate_cache(self, max_slots: int, max_len: int, num_blocks: int = 0) -> None:
        """(Re)allocate the KV cache and the static step buffers; drops captured graphs.
        num_blocks 0: enough for max_slots sequences of max_len."""
        dev, c, bs = self.device, self.c, self.block_size
        self.graphs.clear()
        self.k_cache = self.v_cache = None  # free the old cache before allocating the new one
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        self.max_slots, self.max_len = max_slots, max_len
        self.blocks_per_seq = -(-max_len // bs)
        self.num_blocks = num_blocks or max_slots * self.blocks_per_seq
        # One spare block (index num_blocks): where slots outside a decode step write.
        shape = (c.num_layers, self.num_blocks + 1, self.kv_heads, bs, self.hd)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=dev)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=dev)
        cos, sin = rope_tables(self.inv_freq, max_len + 1)
        self.cos, self.sin = cos.to(dev), sin.to(dev)
        self.step_in = torch.zeros(3, max_slots, dtype=torch.int64, device=dev)  # ids, positions, ctx lens
        # Block tables of a decode step: the first S * (span / block_size) entries, viewed [S, span / block_size].
        self.step_tables = torch.zeros(max_slots * self.blocks_per_seq, dtype=torch.int64, device=dev)
        self.step_out = torch.zeros(max_slots, self.vocab_hi - self.vocab_lo, dtype=torch.float32, device=dev)
        pin = dev.type == "cuda"
        self._host = torch.zeros(3, max_slots, dtype=torch.int64, pin_memory=pin)  # staging for step_in
        self._host_tables = torch.zeros(max_slots * self.blocks_per_seq, dtype=torch.int64, pin_memory=pin)
        self._host_np, self._host_tables_np = self._host.numpy(), self._host_tables.numpy()  # the same memory
        self._iota_np = np.arange(max(max_slots, self.blocks_per_seq), dtype=np.int64)  # slot and block ids
        self._staged: torch.cuda.Event | None = None
        self._span_ids = torch.arange(self.blocks_per_seq * bs, device=dev)
        self._head_rows = torch.arange(self.kv_heads, device=dev) * bs  # a head's first row inside a block

    def slot_tables(self, slots: torch.Tensor) -> torch.Tensor:
        """Block tables for callers that think in slots (as TPModel.slot_tables)."""
        return slots.view(-1, 1).cpu() * self.blocks_per_seq + torch.arange(self.blocks_per_seq)

    def _write_kv(self, li: int, blocks: torch.Tensor, offs: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keys and values [N, kv_heads, head_dim] of N tokens into (block, offset) of layer li."""
        kc, vc = self.k_cache[li], self.v_cache[li]  # type: ignore[index]
        if self.kv_write == "scatter":  # one row copy kernel per tensor, over the cache as rows
            rows = ((blocks * self.kv_heads * self.block_size + offs).view(-1, 1) + self._head_rows).view(-1)
            kc.view(-1, self.hd).index_copy_(0, rows, k.reshape(-1, self.hd))
            vc.view(-1, self.hd).index_copy_(0, rows, v.reshape(-1, self.hd))
        else:
            kc[blocks, :, offs] = k
            vc[blocks, :, offs] = v

    def _gather(self, cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        """Rows' blocks [R, n] of one layer's cache as spans [R, kv_heads, n * block_size, head_dim]."""
        R, n = tables.shape
        g = cache.index_select(0, tables.reshape(-1)).view(R, n, self.kv_heads, self.block_size, self.hd)
        return g.transpose(1, 2).reshape(R, self.kv_heads, n * self.block_size, self.hd)

    def status(self) -> dict[str, Any]:
        return {"device": str(self.device), "dtype": str(self.dtype).removeprefix("torch."),
                "cuda_graphs": self.graphs.enabled, "graphs_captured": len(self.graphs.graphs),
                # one switch: the prefill's RoPE and SiLU kernels go with the decode kernels
                "decode_kernels": self.decode_impl, "prefill_kernels": self.decode_impl,
                **({"decode_kernels_reason": self.decode_reason} if self.decode_reason else {}),
                "eager_batch_buckets": sorted(self.graphs.eager_batches),
                "fused_ops": self.ops.status()}

    def warmup(self) -> float:
        """Compile, check and capture before serving (model/cuda_warmup.py); seconds it took."""
        from switchyard.engine.model.cuda_warmup import warmup

        return warmup(self)

    # -- pieces --------------------------------------------------------------------------

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return embed_tokens(ids, self.embed, self.shard, self.comm)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: [N, hidden] float32 (normed) -> [N, local vocab] float32."""
        if self.lm_head_lowp is None:
            return F.linear(h, self.lm_head)
        logits = F.linear(h.to(self.dtype), self.lm_head_lowp).float()
        top = logits.topk(REFINE, dim=-1).indices
        exact = torch.bmm(self.lm_head[top], h.unsqueeze(-1)).squeeze(-1)
        return logits.scatter_(1, top, exact)

    def _qkv(self, layer: CudaLayer, h: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = F.linear(h, layer.qkv, layer.qkv_b)
        return self._ops.rope_qkv(qkv, cos, sin, self.heads, self.kv_heads, self.hd, layer.q_norm,
                                 layer.k_norm, self.c.rms_eps, self.dtype)

    def _mlp_in(self, layer: CudaLayer, x: torch.Tensor, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.comm.all_reduce(F.linear(attn, layer.o))
        return self._ops.add_rms(x, y, layer.ln2, self.c.rms_eps, self.dtype)

    def _mlp_out(self, layer: CudaLayer, h: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(F.linear(self._ops.silu_mul(F.linear(h, layer.gate_up)), layer.down))

    def _next_norm(self, li: int) -> tuple[torch.Tensor, torch.dtype]:
        return (self.layers[li + 1].ln1, self.dtype) if li + 1 < len(self.layers) else (self.norm, torch.float32)

    # -- decode (graph-capturable) ------------------------------------------------------

    def _decode_core(self, S: int, L: int) -> Iterator[None]:
        """One decode step over slots 0..S-1 attending over positions 0..L-1, from step_in
        to step_out. No host synchronisation: this is what a CUDA graph records. It yields
        after every `layers_per_graph` layers: each part becomes its own graph, so the GPU
        starts on the first part while the host is still launching the next ones."""
        per = max(1, -(-len(self.layers) // max(1, self.graph_parts)))
        self._ops = self.ops if self.graphs.enabled else self.ops_eager
        ids, pos, ctx = self.step_in[0, :S], self.step_in[1, :S], self.step_in[2, :S]
        nb = L // self.block_size
        tables = self.step_tables[: S * nb].view(S, nb)
        w_blocks = tables.gather(1, (pos // self.block_size).view(S, 1)).view(S)
        w_offs = pos % self.block_size
        if self.decode_impl == "fused" and S <= MAX_FUSED_ROWS:
            yield from self._decode_fused(S, L, ids, pos, ctx, tables, w_blocks, w_offs, per)
            return
        H, Hkv, D = self.heads, self.kv_heads, self.hd
        eps = self.c.rms_eps
        # Steps past the fused kernels' 16 rows keep cuBLAS for the projections, and still read
        # the cache in place with the paged attention kernel where the fused kernels passed their
        # check: gathering each row's blocks first cost an 8B step at batch 256 ~17 GB of copies.
        paged = self.decode_impl == "fused"
        if paged:
            from switchyard.engine.backends.cuda import kernels as ck
        x = self._embed(ids)
        cos, sin = self.cos[pos], self.sin[pos]
        G = H // Hkv
        if not paged:  # additive mask; every row may see position 0 so that idle slots' softmax has no NaN
            valid = self._span_ids[:L].unsqueeze(0) < ctx.clamp(min=1).unsqueeze(1)
            mask = torch.zeros(S, 1, 1, L, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~valid.view(S, 1, 1, L), float("-inf"))
            if self.attn_impl == "bmm":
                bias = torch.zeros(S, 1, 1, L, dtype=torch.float32, device=self.device)
                bias.masked_fill_(~valid.view(S, 1, 1, L), float("-inf"))
        h = rms_norm(x, self.layers[0].ln1, eps, self.dtype)
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, h, cos, sin)
            self._write_kv(li, w_blocks, w_offs, k, v)
            if paged:
                o = ck.paged_attention(q.reshape(S, H, D), self.k_cache[li], self.v_cache[li], tables, ctx, L)
            else:
                kc = self._gather(self.k_cache[li], tables)  # type: ignore[index]
                vc = self._gather(self.v_cache[li], tables)  # type: ignore[index]
                if self.attn_impl == "bmm":
                    s = torch.bmm(q.view(S * Hkv, G, D), kc.view(S * Hkv, L, D).transpose(1, 2))
                    p = self._ops.masked_softmax(s.view(S, Hkv, G, L), bias, 1.0 / D ** 0.5, self.dtype)
                    o = torch.bmm(p.view(S * Hkv, G, L), vc.view(S * Hkv, L, D))
                else:
                    with sdpa_kernel(_DECODE_SDPA):
                        o = F.scaled_dot_product_attention(q.view(S, Hkv, G, D), kc, vc, attn_mask=mask)
            x, h = self._mlp_in(layer, x, o.reshape(S, H * D))
            w, dt = self._next_norm(li)
            x, h = self._ops.add_rms(x, self._mlp_out(layer, h), w, eps, dt)
            if (li + 1) % per == 0 and li + 1 < len(self.layers):
                yield
        self.step_out[:S].copy_(self._logits(h))

    def _decode_fused(self, S: int, L: int, ids: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor,
                      tables: torch.Tensor, w_blocks: torch.Tensor, w_offs: torch.Tensor, per: int) -> Iterator[None]:
        """The same step in five Triton kernels a layer (cuda_kernels): what _decode_core runs for
        up to 16 rows on one rank."""
        from switchyard.engine.backends.cuda import kernels as ck

        eps = self.c.rms_eps
        x = self._embed(ids)
        for li, layer in enumerate(self.layers):
            kc, vc = self.k_cache[li], self.v_cache[li]  # type: ignore[index]
            q = ck.qkv_rope(x, layer.ln1, layer.qkv, layer.qkv_b, layer.qk_norm, self.cos, self.sin, pos, w_blocks,
                            w_offs, kc, vc, self.heads, self.kv_heads, eps)
            x = ck.gemv_residual(ck.paged_attention(q, kc, vc, tables, ctx, L), layer.o, x)
            x = ck.gemv_residual(ck.gate_up_silu(x, layer.ln2, layer.gate_up, eps), layer.down, x)
            if (li + 1) % per == 0 and li + 1 < len(self.layers):
                yield
        self.step_out[:S].copy_(self._logits(rms_norm(x, self.norm, eps, torch.float32)))

    # -- the TPModel contract -----------------------------------------------------------

    @torch.inference_mode()
    def forward(self, step: Step) -> torch.Tensor:
        """As TPModel.forward: the logits of each row's last new token."""
        ids, positions, slots, lens, ctx_lens = step.ids, step.positions, step.slots, step.lens, step.ctx_lens
        view_slots, block_tables = step.view_slots, step.tables
        B, T = ids.shape
        if T > 1:
            tables = self.slot_tables(slots) if block_tables is None else block_tables.cpu()
            return self._prefill(ids, positions, tables, lens, ctx_lens)
        # A decode step's host work is on every token's path (at batch 1 it rivals a small
        # model's whole GPU step), so it stages the inputs with numpy on the pinned buffers'
        # memory: a third of the time of the same dozen torch calls.
        slot_np = slots.cpu().numpy()
        ctx_np = ctx_lens.cpu().numpy()
        S = batch_bucket(max(view_slots, int(slot_np.max()) + 1), self.max_slots)
        # The span: a bucket of whole blocks, so that it splits into each row's blocks.
        L = -(-len_bucket(int(ctx_np.max()), self.max_len) // self.block_size) * self.block_size
        nb = L // self.block_size
        if self._staged is not None:
            self._staged.synchronize()  # the previous step's copies have left the staging buffers
        staged = self._host_np[:, :S]
        staged[:] = 0  # slots outside this step: token 0 at position 0 of the spare block
        staged[0, slot_np] = ids.cpu().numpy()[:, 0]
        staged[1, slot_np] = positions.cpu().numpy()[:, 0]
        staged[2, slot_np] = ctx_np
        staged_tables = self._host_tables_np[: S * nb].reshape(S, nb)
        staged_tables.fill(self.num_blocks)
        if block_tables is None:  # slot s owns blocks s * blocks_per_seq onwards
            staged_tables[slot_np] = slot_np[:, None] * self.blocks_per_seq + self._iota_np[:nb]
        else:
            tables = block_tables.cpu().numpy()
            w = min(nb, tables.shape[1])
            staged_tables[slot_np, :w] = tables[:, :w]
        self.step_in[:, :S].copy_(self._host[:, :S], non_blocking=True)
        self.step_tables[: S * nb].copy_(self._host_tables[: S * nb], non_blocking=True)
        if self.device.type == "cuda":
            self._staged = torch.cuda.Event()
            self._staged.record()
        self.graphs.run(S, L)
        if B == 1:
            return self.step_out[int(slot_np[0]): int(slot_np[0]) + 1].clone()
        if (slot_np == self._iota_np[:B]).all():  # slots 0..B-1: no index upload
            return self.step_out[:B].clone()
        return self.step_out[slots.to(self.device, non_blocking=True)]

    def _prefill(self, ids: torch.Tensor, positions: torch.Tensor, tables: torch.Tensor,
                 lens: torch.Tensor, ctx_lens: torch.Tensor) -> torch.Tensor:
        """Prompts (right-padded rows) from position 0, or continuing one whose start is cached."""
        dev, bs = self.device, self.block_size
        B, T = ids.shape
        H, Hkv, D = self.heads, self.kv_heads, self.hd
        self._ops = self.ops if B * T >= COMPILED_PREFILL_TOKENS else self.ops_eager
        eps = self.c.rms_eps
        positions, lens = positions.cpu(), lens.cpu()
        fresh = bool((positions[:, 0] == 0).all())
        # The rows that are not padding (padding is not written: it may lie past the row's
        # blocks), and where each goes.
        sel = (torch.arange(T).unsqueeze(0) < lens.unsqueeze(1)).view(-1).nonzero().view(-1)
        blocks = tables.gather(1, (positions // bs).clamp(max=tables.shape[1] - 1)).view(-1)[sel]
        offs = (positions.view(-1) % bs)[sel]
        sel, w_blocks, w_offs = sel.to(dev), blocks.to(dev), offs.to(dev)
        if not fresh:
            nb = -(-int(ctx_lens.max()) // bs)
            span = tables[:, :nb].to(dev)
            mask = (self._span_ids[: nb * bs].view(1, 1, -1) <= positions.to(dev).unsqueeze(-1)).unsqueeze(1)
        ids, pos = ids.to(dev).reshape(-1), positions.to(dev).reshape(-1)
        x = self._embed(ids)
        fused = self.decode_impl == "fused"  # the Triton RoPE and SiLU go with the decode kernels
        if fused:
            from switchyard.engine.backends.cuda import prefill_kernels as pk
        else:
            cos, sin = self.cos[pos], self.sin[pos]
        h = rms_norm(x, self.layers[0].ln1, eps, self.dtype)
        for li, layer in enumerate(self.layers):
            if fused:
                q, k, v = pk.rope_split(F.linear(h, layer.qkv, layer.qkv_b), self.cos, self.sin, pos, H, Hkv, D,
                                        layer.qk_norm, eps)
            else:
                q, k, v = self._qkv(layer, h, cos, sin)
            self._write_kv(li, w_blocks, w_offs, k.index_select(0, sel), v.index_select(0, sel))
            q = q.view(B, T, H, D).transpose(1, 2)
            if fresh:
                k = k.view(B, T, Hkv, D).transpose(1, 2)
                v = v.view(B, T, Hkv, D).transpose(1, 2)
                backend = self.prefill_sdpa if self.prefill_sdpa != "auto" else ("cudnn" if B * T >= 4096 else "flash")
                with sdpa_kernel(PREFILL_SDPA[backend]):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H)
            else:
                k = self._gather(self.k_cache[li], span)  # type: ignore[index]
                v = self._gather(self.v_cache[li], span)  # type: ignore[index]
                with sdpa_kernel(_DECODE_SDPA):  # a mask: no flash attention
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=Hkv != H)
            x, h = self._mlp_in(layer, x, o.transpose(1, 2).reshape(B * T, H * D))
            w, dt = self._next_norm(li)
            if fused:
                y = self.comm.all_reduce(F.linear(pk.silu_mul(F.linear(h, layer.gate_up)), layer.down))
            else:
                y = self._mlp_out(layer, h)
            x, h = self._ops.add_rms(x, y, w, eps, dt)
        last = torch.arange(B, device=dev) * T + lens.to(dev) - 1
        return self._logits(h[last])
