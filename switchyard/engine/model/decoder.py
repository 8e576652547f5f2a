"""The tensor-parallel Llama-family decoder (Llama, SmolLM2, Qwen2 bias, Qwen3 q/k norm).

Column-parallel QKV and gate/up, row-parallel o_proj and down_proj, each followed by one
all-reduce through the collective backend; vocab-parallel embedding and LM head. The KV
cache is paged: one preallocated pool of fixed-size blocks per layer, [blocks, kv_heads,
block_size, head_dim], and each step's block tables (rank 0's scheduler decides them, see
kv_blocks) say which blocks hold each sequence's positions. A step never allocates cache memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from switchyard.engine.backends.cpu.native import load as load_native
from switchyard.engine.backends.cpu.rowops import RowOps, rotate_torch
from switchyard.engine.model.common import REFINE, embed_tokens, rope_inv_freq, rope_tables
from switchyard.engine.model.config import KV_CACHE_DTYPES, ModelConfig
from switchyard.engine.model.linear import GROUP, Int4, make_linear
from switchyard.engine.model.parallel import CollectiveBackend
from switchyard.engine.model.step import Step
from switchyard.engine.model.weights import Shard

_LAYER_ERRORS = {1: "shape unsupported", 2: "position outside the cache", 3: "out of memory"}


class Layer:
    __slots__ = ("ln1", "ln2", "qkv", "o", "gate_up", "down", "q_norm", "k_norm")

    def __init__(self, w: dict[str, torch.Tensor], p: str, dtype: torch.dtype, fmt: str) -> None:
        self.ln1 = w[p + "input_layernorm.weight"]
        self.ln2 = w[p + "post_attention_layernorm.weight"]
        bias = [w.get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
        self.qkv = make_linear(torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]),
                               torch.cat(bias) if bias[0] is not None else None, fmt)  # type: ignore[arg-type]
        self.o = make_linear(w[p + "self_attn.o_proj.weight"], None, fmt)
        self.gate_up = make_linear(torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]), None, fmt)
        self.down = make_linear(w[p + "mlp.down_proj.weight"], None, fmt)
        self.q_norm = w.get(p + "self_attn.q_norm.weight")
        self.k_norm = w.get(p + "self_attn.k_norm.weight")


def resolve_kv_dtype(requested: str, fmt: str, native_attention: bool) -> torch.dtype:
    """`auto`: float16 when the weights are int4 and the native decode attention reads the
    cache (at batch 16 the float32 cache was read at ~12 GB/s, 4-5 ms of a ~20 ms step);
    float32 otherwise, and always with float32 weights, where the engine is exact."""
    if requested not in KV_CACHE_DTYPES:
        raise ValueError(f"KV cache dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {requested!r}")
    if requested == "auto":
        return torch.float16 if fmt == "int4" and native_attention else torch.float32
    return getattr(torch, requested)


@dataclass
class _Plan:
    """What every layer's attention in one forward shares, worked out once a step."""

    B: int
    T: int
    positions: torch.Tensor  # [B, T]
    tables: torch.Tensor  # [B, W] block ids, contiguous int64
    fresh: bool  # decode, or prompts from position 0; else a continued prompt (cached start)
    pos_flat: torch.Tensor | None = None  # decode: [B] positions
    scale: float = 1.0
    L: int = 0  # positions attended over, whole blocks (torch's decode path, continued prompts)
    valid: torch.Tensor | None = None  # prefill: [B, T] rows that are not padding
    w_blocks: torch.Tensor | None = None  # where the new keys and values go: blocks ...
    w_offs: torch.Tensor | None = None  # ... and positions inside them
    mask: torch.Tensor | None = None  # continued prompts: [B, 1, T, L] causal over the cache
    bias: torch.Tensor | None = None  # torch's decode path: [B, 1, 1, L] additive mask
    cos: torch.Tensor | None = None  # torch's RoPE, filled on first use
    sin: torch.Tensor | None = None


class TPModel:
    """One rank's shard of the model plus its KV cache. Not an nn.Module: no autograd, no hooks."""

    chunked_prefill = True  # a prefill step may continue a prompt whose start is already cached

    def __init__(self, config: ModelConfig, shard: Shard, weights: dict[str, torch.Tensor],
                 comm: CollectiveBackend, max_slots: int, max_len: int,
                 dtype: torch.dtype | str = torch.float32, kv_dtype: str = "auto", block_size: int = 16,
                 num_blocks: int = 0) -> None:
        # "int4": int4 projection weights (see linear.Int4); else a dense dtype.
        fmt = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
        if fmt == "int4":  # what the int4 kernel takes: float32 on ours, bfloat16 on torch's
            dtype = torch.float32 if load_native()[0] is not None else torch.bfloat16
        else:
            dtype = getattr(torch, fmt)
        self.c = config
        self.shard = shard
        self.comm = comm
        self.dtype = dtype
        self.heads, self.kv_heads, self.hd = shard.heads, shard.kv_heads, config.head_dim
        self.vocab_lo, self.vocab_hi = shard.vocab_rows
        # Embedding and LM head stay float32: bfloat16 logits (steps of 0.125 near 25) turn
        # close calls into ties and flip greedy choices.
        self.embed = weights["embed_tokens.weight"].contiguous()
        self.lm_head = weights["lm_head.weight"].contiguous() if "lm_head.weight" in weights else self.embed
        self.norm = weights["norm.weight"]
        self.lm_head_q4 = Int4(self.lm_head, None) if fmt == "int4" and config.hidden_size % GROUP == 0 else None
        # torch's int4 kernel loses to a bfloat16 matmul once a step has a few rows; ours does not.
        native_head = self.lm_head_q4 is not None and self.lm_head_q4.native is not None
        self.lm_head_lowp = self.lm_head.to(torch.bfloat16) if fmt == "int4" and not native_head else None
        self.layers = [Layer(weights, f"layers.{i}.", dtype, fmt) for i in range(config.num_layers)]
        self.max_slots, self.max_len = max_slots, max_len
        # num_blocks 0: as many as max_slots sequences of max_len need, the memory a cache of
        # one max_len slot per sequence took.
        self.block_size = block_size
        self.blocks_per_seq = -(-max_len // block_size)
        self.num_blocks = num_blocks or max_slots * self.blocks_per_seq
        lib, _ = load_native()
        fits = (self.hd % 16 == 0 and self.hd <= 256 and self.heads // max(1, self.kv_heads) <= 16
                and block_size % 16 == 0)
        self.attn = lib.sy_decode_attn if lib is not None and fits else None
        shape = (config.num_layers, self.num_blocks, self.kv_heads, block_size, self.hd)
        self.k_cache = torch.zeros(shape, dtype=resolve_kv_dtype(kv_dtype, fmt, self.attn is not None))
        self.v_cache = torch.zeros_like(self.k_cache)
        self.cos, self.sin = rope_tables(rope_inv_freq(config, weights.get("rope_freqs")), max_len)
        self._q_size = self.heads * self.hd
        self.ops = RowOps(lib, self.cos, self.sin)
        self._kv_size = self.kv_heads * self.hd
        # One rank with our int4 kernels: each layer's work around its attention is two native
        # calls (native/layer.c), bit-identical to the op-by-op path below.
        self._lib = lib
        self.fused = (lib is not None and shard.tp == 1 and config.hidden_size % 16 == 0 and all(
            layer.q_norm is None and all(isinstance(p, Int4) and p.weight is not None
                                         for p in (layer.qkv, layer.o, layer.gate_up, layer.down))
            for layer in self.layers))
        self._ws = torch.empty(0)

    def status(self) -> dict[str, object]:
        return {"device": "cpu"}

    def slot_tables(self, slots: torch.Tensor) -> torch.Tensor:
        """Block tables for callers that think in slots: slot s owns blocks
        s * blocks_per_seq .. (s + 1) * blocks_per_seq - 1 (the whole pool at its default size)."""
        return (slots.view(-1, 1) * self.blocks_per_seq + torch.arange(self.blocks_per_seq)).contiguous()

    def _native_attention(self, qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tables: torch.Tensor,
                          pos: torch.Tensor, scale: float) -> torch.Tensor:
        """Write this step's keys and values into their blocks and attend, in one native call,
        on the projection's rows as they are (queries, keys, values side by side)."""
        B = qkv.shape[0]
        qkv = qkv.contiguous()
        out = qkv.new_empty(B, 1, self._q_size)
        rc = self.attn(qkv.data_ptr(), kc.data_ptr(), vc.data_ptr(), tables.data_ptr(), tables.shape[1],
                       pos.data_ptr(), B, self.heads, self.kv_heads, self.hd, self.num_blocks, self.block_size, scale,
                       out.data_ptr(), torch.get_num_threads(), int(kc.dtype == torch.float16))
        if rc:
            why = {1: "head shape or block size unsupported", 2: "block or position outside the cache",
                   3: "out of memory"}
            raise RuntimeError(f"native decode attention failed: {why.get(rc, rc)}")
        return out

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return embed_tokens(ids, self.embed, self.shard, self.comm)

    def _plan(self, positions: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
              ctx_lens: torch.Tensor) -> _Plan:
        B, T = positions.shape
        bs = self.block_size
        fresh = T == 1 or bool((positions[:, 0] == 0).all())
        step = _Plan(B, T, positions, tables, fresh)
        if T == 1:
            step.pos_flat = positions[:, 0].contiguous()
            step.scale = 1.0 / math.sqrt(self.hd)
        if T > 1 or self.attn is None:
            # Where this step's keys and values go; right padding is not written (its positions
            # may lie past the row's blocks).
            step.valid = torch.arange(T).unsqueeze(0) < lens.unsqueeze(1)
            blocks = tables.gather(1, (positions // bs).clamp(max=tables.shape[1] - 1))
            step.w_blocks, step.w_offs = blocks[step.valid], (positions % bs)[step.valid]
        if T == 1 and self.attn is None or not fresh:
            L = step.L = -(-int(ctx_lens.max()) // bs) * bs
            if T == 1:
                step.bias = torch.where(torch.arange(L) < ctx_lens.unsqueeze(1), 0.0, float("-inf")).view(B, 1, 1, L)
            else:
                step.mask = (torch.arange(L).view(1, 1, L) <= positions.unsqueeze(-1)).unsqueeze(1)
        return step

    def _gather(self, cache: torch.Tensor, st: _Plan) -> torch.Tensor:
        """The step's sequences' first L positions of one layer's cache: [B, kv_heads, L, head_dim], float32."""
        blocks = cache[st.tables[:, : st.L // self.block_size]]  # [B, L / bs, kv_heads, bs, head_dim]
        return blocks.transpose(1, 2).reshape(st.B, self.kv_heads, st.L, self.hd).float()

    def _attend(self, qkv: torch.Tensor, rotated: bool, layer: Layer, kc: torch.Tensor, vc: torch.Tensor,
                st: _Plan) -> torch.Tensor:
        """One layer's attention off the native decode path: q/k norms and RoPE in torch where
        they are still due, the cache written, then decode (native or torch), a fresh prefill
        or a later chunk of a prompt. Returns [B, T, heads * head_dim]."""
        B, T, H, Hkv, D = st.B, st.T, self.heads, self.kv_heads, self.hd
        q, k, v = qkv.split((self._q_size, self._kv_size, self._kv_size), dim=-1)
        q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        if not rotated:
            if layer.q_norm is not None:
                q = self.ops.rms_norm(q, layer.q_norm, self.c.rms_eps)
                k = self.ops.rms_norm(k, layer.k_norm, self.c.rms_eps)
            if st.cos is None:
                st.cos, st.sin = self.cos[st.positions].unsqueeze(2), self.sin[st.positions].unsqueeze(2)
            q, k = rotate_torch(q, st.cos, st.sin), rotate_torch(k, st.cos, st.sin)
        if T == 1 and self.attn is not None:
            qkv = torch.cat((q.flatten(2), k.flatten(2), v.flatten(2)), dim=-1)
            return self._native_attention(qkv, kc, vc, st.tables, st.pos_flat, st.scale)
        kc[st.w_blocks, :, st.w_offs] = k[st.valid].to(kc.dtype)
        vc[st.w_blocks, :, st.w_offs] = v[st.valid].to(vc.dtype)
        if T == 1:
            qh = (q[:, 0] * st.scale).view(B, Hkv, H // Hkv, D)
            scores = torch.matmul(qh, self._gather(kc, st).transpose(-1, -2))
            o = torch.matmul(torch.softmax(scores + st.bias, dim=-1), self._gather(vc, st))
            return o.reshape(B, T, H * D)
        if st.fresh:  # prompts from position 0: attend over their own keys and values
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True)
        else:
            # A prompt whose start is cached (an earlier chunk, or a prefix another sequence
            # computed): attend over its blocks so far, causal from each position.
            o = F.scaled_dot_product_attention(q.transpose(1, 2), self._gather(kc, st), self._gather(vc, st),
                                               attn_mask=st.mask, enable_gqa=True)
        return o.transpose(1, 2).reshape(B, T, self._q_size)

    @torch.inference_mode()
    def forward(self, step: Step) -> torch.Tensor:
        """Run one step and return this rank's slice of the logits of each row's last new token
        (see model/step.py for what a step holds; slots and view_slots are the GPU decoder's)."""
        ids, positions, lens, ctx_lens = step.ids, step.positions, step.lens, step.ctx_lens
        block_tables = step.tables
        B, T = ids.shape
        x = self._embed(ids)  # the residual stream, float32, updated in place
        ops = self.ops
        eps = self.c.rms_eps
        tables = self.slot_tables(step.slots) if block_tables is None else block_tables.contiguous()
        plan = self._plan(positions, tables, lens, ctx_lens)
        if self.fused:
            self._fused_layers(x, plan)
        else:
            self._layers(x, plan)
        last = x[torch.arange(B), lens - 1]
        h = ops.rms_norm(last, self.norm, eps)
        if self.lm_head_q4 is None and self.lm_head_lowp is None:
            return F.linear(h, self.lm_head)
        # Low-precision logits for the whole vocabulary, then the best few recomputed in
        # float32, so greedy choices and the top logprobs are exact.
        head = self.lm_head_q4 if self.lm_head_q4 is not None and (B <= 4 or self.lm_head_lowp is None) else None
        logits = (head(h) if head is not None else F.linear(h.to(torch.bfloat16), self.lm_head_lowp)).float()
        top = ops.topk(logits, REFINE)
        exact = ops.gather_dot(self.lm_head, h.contiguous(), top)
        return logits.scatter_(1, top, exact)

    def _attention(self, qkv: torch.Tensor, rotated: bool, layer: Layer, li: int, st: _Plan) -> torch.Tensor:
        kc, vc = self.k_cache[li], self.v_cache[li]
        if st.T == 1 and self.attn is not None and rotated:  # the usual decode step: no views, no copies
            return self._native_attention(qkv, kc, vc, st.tables, st.pos_flat, st.scale)
        return self._attend(qkv, rotated, layer, kc, vc, st)

    def _layers(self, x: torch.Tensor, step: _Plan) -> None:
        """The layers op by op (any rank count, any weights), updating the residual x in place."""
        ops, eps, positions = self.ops, self.c.rms_eps, step.positions
        h = ops.rms_norm(x, self.layers[0].ln1, eps, self.dtype)
        for li, layer in enumerate(self.layers):
            qkv = layer.qkv(h).float()  # attention and the KV cache stay in float32
            rotated = layer.q_norm is None and ops.rope_(qkv, positions, self.heads + self.kv_heads, self.hd)
            o = self._attention(qkv, rotated, layer, li, step).to(self.dtype)
            h = ops.add_rms_norm(x, self.comm.all_reduce(layer.o(o)).float(), layer.ln2, eps, self.dtype)
            delta = self.comm.all_reduce(layer.down(ops.silu_mul(layer.gate_up(h)))).float()
            if li + 1 < len(self.layers):  # the residual add, fused with the next layer's norm
                h = ops.add_rms_norm(x, delta, self.layers[li + 1].ln1, eps, self.dtype)
            else:
                x.add_(delta)

    def _fused_layers(self, x: torch.Tensor, step: _Plan) -> None:
        """The layers in two native calls each around attention (see native/layer.c)."""
        B, T, D = step.B, step.T, self.c.hidden_size
        M = B * T
        first = self.layers[0]
        n_qkv, inter = first.qkv.n, first.down.k
        sizes = (M * D, M * n_qkv, M * D, M * 2 * inter, M * inter, M * D)  # h, qkv, t, gu, act, delta
        if self._ws.numel() < sum(sizes):  # kept between steps: no allocation, no page faults
            self._ws = torch.empty(sum(sizes))
        h, qkv, t, gu, act, delta = self._ws[:sum(sizes)].split(sizes)
        pos = step.positions.contiguous()
        threads, eps, lib = torch.get_num_threads(), self.c.rms_eps, self._lib
        ptr = [v.data_ptr() for v in (x, h, qkv, t, gu, act, delta)]
        cos, sin, rope_heads = self.cos.data_ptr(), self.sin.data_ptr(), self.heads + self.kv_heads
        for li, layer in enumerate(self.layers):
            bias = layer.qkv.b
            rc = lib.sy_layer_in(ptr[0], ptr[6] if li else None, layer.ln1.data_ptr(), eps, layer.qkv.weight,
                                 None if bias is None else bias.data_ptr(), ptr[1], ptr[2], M, rope_heads, self.hd,
                                 cos, sin, pos.data_ptr(), self.max_len, threads)
            if rc:
                raise RuntimeError(f"native layer (norm, QKV, RoPE) failed: {_LAYER_ERRORS.get(rc, rc)}")
            o = self._attention(qkv.view(B, T, n_qkv), True, layer, li, step).contiguous()
            rc = lib.sy_layer_out(o.data_ptr(), ptr[0], layer.ln2.data_ptr(), eps, layer.o.weight,
                                  layer.gate_up.weight, layer.down.weight, ptr[3], ptr[1], ptr[4], ptr[5], ptr[6], M,
                                  threads)
            if rc:
                raise RuntimeError(f"native layer (output, norm, MLP) failed: {_LAYER_ERRORS.get(rc, rc)}")
        x.view(M, D).add_(delta.view(M, D))
