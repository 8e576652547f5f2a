"""The tensor-parallel Llama-family decoder (Llama, SmolLM2, Qwen2 bias, Qwen3 q/k norm), one
for every device.

Column-parallel QKV and gate/up, row-parallel o_proj and down_proj, each followed by one
all-reduce through the collective backend; vocab-parallel embedding and LM head. The KV cache is
paged: one preallocated pool of fixed-size blocks per layer, [blocks, kv_heads, block_size,
head_dim], and each step's block tables (rank 0's scheduler decides them, see core/kv_blocks)
say which blocks hold each sequence's positions. A step never allocates cache memory.

What is the same on every device lives here: the weights, the cache, the RoPE tables, the
float32 embedding and residual stream, the layer loop, and the logits (exact float32 logits for
the best REFINE candidates after a low-precision head). How a layer runs on a device is its
backend's (backends/base.py, by name in backends/registry.py): `cpu` (native kernels), `torch`
(any device), `cuda` (Triton kernels). A backend that decodes in slot space has its decode
steps run by model/graph_runner.py, replayed as CUDA graphs on a GPU.
"""

from __future__ import annotations

import copy
from collections.abc import Generator
from typing import Any

import torch
import torch.nn.functional as F

from switchyard.engine.backends import registry
from switchyard.engine.backends.base import Backend, EagerInput, ModelDims, Plan
from switchyard.engine.backends.cpu.native import load as load_native
from switchyard.engine.errors import ConfigError
from switchyard.engine.model.common import REFINE, embed_tokens, rope_inv_freq, rope_tables
from switchyard.engine.model.config import ModelConfig
from switchyard.engine.model.graph_runner import GraphRunner
from switchyard.engine.model.layer import Layer
from switchyard.engine.model.linear import GROUP, Int4
from switchyard.engine.model.parallel import CollectiveBackend
from switchyard.engine.model.step import Step
from switchyard.engine.model.weights import Shard


class Decoder:
    """One rank's shard of the model plus its KV cache and a backend. Not an nn.Module: no
    autograd, no hooks.

    dtype: the projections' format, int4 (CPU), float32 or bfloat16; auto: bfloat16 on a GPU,
    float32 on a CPU. backend: a registry name or auto (see registry.resolve). kv_dtype: the CPU
    backend's choice (auto, float32, float16); the GPU's cache is in the model dtype. prefill_fp8:
    FP8 copies of the projections for the cuda backend's long prefills (backends/cuda/fp8.py);
    refused (ConfigError) where that backend, an sm89+ GPU or bf16 weights are not."""

    def __init__(self, config: ModelConfig, shard: Shard, weights: dict[str, torch.Tensor],
                 comm: CollectiveBackend, max_slots: int, max_len: int, *, backend: str = "auto",
                 device: torch.device | str = "cpu", dtype: torch.dtype | str = "auto", kv_dtype: str = "auto",
                 block_size: int = 16, num_blocks: int = 0, cuda_graphs: bool = True,
                 prefill_fp8: bool = False) -> None:
        dev = self.device = torch.device(device)
        fmt = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
        if fmt == "auto":
            fmt = "float32" if dev.type == "cpu" else "bfloat16"
        self.fmt = fmt
        if fmt == "int4":  # what the int4 kernel takes: float32 on ours, bfloat16 on torch's
            self.dtype = torch.float32 if load_native()[0] is not None else torch.bfloat16
        else:
            self.dtype = getattr(torch, fmt)
        self.c, self.shard, self.comm = config, shard, comm
        self.heads, self.kv_heads, self.hd = shard.heads, shard.kv_heads, config.head_dim
        self.vocab_lo, self.vocab_hi = shard.vocab_rows
        # Embedding and LM head stay float32: bfloat16 logits (steps of 0.125 near 25) turn
        # close calls into ties and flip greedy choices.
        self.embed = weights["embed_tokens.weight"].to(device=dev, dtype=torch.float32).contiguous()
        head = weights.get("lm_head.weight")
        self.lm_head = self.embed if head is None else head.to(device=dev, dtype=torch.float32).contiguous()
        self.norm = weights["norm.weight"].to(device=dev, dtype=torch.float32)
        # The whole vocabulary's logits at low precision, then the best REFINE in float32:
        # int4 on our kernel where it runs (torch's int4 kernel loses to a bfloat16 matmul once a
        # step has a few rows; ours does not), else the matmul dtype.
        self.lm_head_q4 = Int4(self.lm_head, None) if fmt == "int4" and config.hidden_size % GROUP == 0 else None
        native_head = self.lm_head_q4 is not None and self.lm_head_q4.native is not None
        lowp = torch.bfloat16 if fmt == "int4" else self.dtype
        self.lm_head_lowp = None if native_head or lowp == torch.float32 else self.lm_head.to(lowp)
        self.backend_name, self.backend_reason = registry.resolve(backend, dev, shard.tp)
        self.prefill_fp8 = prefill_fp8  # the cuda backend's long prefills on FP8 copies of the projections
        if prefill_fp8:  # refused before the weights go to the device
            if self.backend_name != "cuda":
                raise ConfigError(f"--prefill-fp8 runs on the cuda backend, not {self.backend_name} "
                                  f"({self.backend_reason or 'as asked'})")
            from switchyard.engine.backends.cuda import fp8

            why = fp8.unsupported(dev, self.dtype)
            if why:
                raise ConfigError(f"--prefill-fp8: {why}")
        self.layers = [Layer(weights, f"layers.{i}.", fmt, dev) for i in range(config.num_layers)]
        if prefill_fp8:
            fp8.attach(self.layers)
        self.inv_freq = rope_inv_freq(config, weights.get("rope_freqs"))
        self.kv_request, self.cuda_graphs, self.block_size = kv_dtype, cuda_graphs, block_size
        self.backend: Backend
        self.graph_runner: GraphRunner | None = None
        self.allocate_cache(max_slots, max_len, num_blocks)

    # -- memory --------------------------------------------------------------------------

    def allocate_cache(self, max_slots: int, max_len: int, num_blocks: int = 0) -> None:
        """(Re)allocate the KV cache (num_blocks 0: enough for max_slots sequences of max_len),
        and with it the backend and the graph runner (captured graphs are dropped)."""
        dev, bs = self.device, self.block_size
        # Free the old cache (and the views and graphs that hold it) before allocating the new one.
        self.k_cache = self.v_cache = None
        self._layer_kv: list[tuple[Layer, torch.Tensor, torch.Tensor]] = []
        self.graph_runner = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        self.max_slots, self.max_len = max_slots, max_len
        self.blocks_per_seq = -(-max_len // bs)
        self.num_blocks = num_blocks or max_slots * self.blocks_per_seq
        cos, sin = rope_tables(self.inv_freq, max_len + 1)
        self.cos, self.sin = cos.to(dev), sin.to(dev)
        self.dims = ModelDims(self.heads, self.kv_heads, self.hd, self.c.hidden_size, self.c.rms_eps, self.shard.tp,
                              dev, self.dtype, bs, self.num_blocks, max_len, self.cos, self.sin, self.comm)
        self.backend = registry.make(self.backend_name, self.dims, self.layers)
        # A backend that decodes in slot space gets one spare block (index num_blocks), where
        # the slots outside a decode step write.
        spare = 1 if self.backend.slot_decode else 0
        shape = (self.c.num_layers, self.num_blocks + spare, self.kv_heads, bs, self.hd)
        self.k_cache = torch.zeros(shape, dtype=self.backend.kv_dtype(self.kv_request, self.fmt), device=dev)
        self.v_cache = torch.zeros_like(self.k_cache)
        self._layer_kv = list(zip(self.layers, self.k_cache, self.v_cache, strict=True))  # each layer's views
        if self.backend.slot_decode:
            self.graph_runner = self._graph_runner(self.cuda_graphs)

    def _graph_runner(self, cuda_graphs: bool, parts: int | None = None) -> GraphRunner:
        return GraphRunner(self.dims, self.decode_step, self.max_slots, self.vocab_hi - self.vocab_lo,
                           len(self.layers), cuda_graphs, parts)

    def use_backend(self, name: str, reason: str = "") -> None:
        """Run on another backend from now on (the start-up check's fallback), over the same cache."""
        self.backend_name, self.backend_reason = name, reason
        self.backend = registry.make(name, self.dims, self.layers)
        if self.graph_runner is not None:
            self.graph_runner.graphs.clear()

    def view(self, backend: str, *, cuda_graphs: bool = False, max_slots: int = 1,
             graph_parts: int | None = None) -> Decoder:
        """This decoder's weights and cache run by another backend (made anew, or this one's
        when named alike) with a graph runner of its own: how the start-up check and the
        benches put two backends side by side."""
        v = copy.copy(self)
        v.backend = self.backend if backend == self.backend_name else registry.make(backend, self.dims, self.layers)
        v.backend_name, v.backend_reason, v.max_slots, v.cuda_graphs = backend, "", max_slots, cuda_graphs
        v.graph_runner = v._graph_runner(cuda_graphs, graph_parts) if v.backend.slot_decode else None
        return v

    @property
    def chunked_prefill(self) -> bool:
        """Whether a prefill step may continue a prompt whose start is already cached."""
        return self.backend.chunked_prefill

    def status(self) -> dict[str, Any]:
        st: dict[str, Any] = {"device": str(self.device), "backend": self.backend_name}
        if self.graph_runner is not None:
            st |= {"dtype": str(self.dtype).removeprefix("torch."), **self.graph_runner.status()}
        st |= self.backend.status()
        if self.backend_reason:
            st["decode_kernels_reason"] = self.backend_reason
        return st

    def warmup(self) -> float:
        """Check, compile and capture before serving (model/warmup.py); seconds it took."""
        from switchyard.engine.model.warmup import warmup

        return warmup(self)

    def slot_tables(self, slots: torch.Tensor) -> torch.Tensor:
        """Block tables for callers that think in slots: slot s owns blocks
        s * blocks_per_seq .. (s + 1) * blocks_per_seq - 1 (the whole pool at its default size)."""
        return (slots.view(-1, 1).cpu() * self.blocks_per_seq + torch.arange(self.blocks_per_seq)).contiguous()

    # -- a step --------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, step: Step) -> torch.Tensor:
        """Run one step and return this rank's slice of the logits of each row's last new token
        (see model/step.py for what a step holds)."""
        if step.T == 1 and self.graph_runner is not None:
            return self.graph_runner.run(step)
        tables = self.slot_tables(step.slots) if step.tables is None else step.tables.contiguous()
        plan = self.backend.plan(EagerInput(step.ids, step.positions, step.lens, step.ctx_lens, tables))
        return drain(self.run(plan))

    def decode_step(self, ids: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor, tables: torch.Tensor, span: int,
                    graphs: bool, per: int, out: torch.Tensor | None = None) -> Generator[None, None, torch.Tensor]:
        """A decode step in slot space, from the graph runner's static buffers (see run)."""
        return (yield from self.run(self.backend.decode_plan(ids, pos, ctx, tables, span, graphs), per, out))

    def run(self, plan: Plan, per: int = 0, out: torch.Tensor | None = None) -> Generator[None, None, torch.Tensor]:
        """Embedding, layers, final norm and logits of a planned step; yields after every `per`
        layers (0: never), so that a graph runner can capture the step in parts. out: where the
        logits may be written (logits)."""
        be = self.backend
        x = embed_tokens(plan.ids, self.embed, self.shard, self.comm)  # the residual stream, float32
        whole = be.all_layers(x, self.k_cache, self.v_cache, plan)
        if whole is not None:
            return self.logits(be.final(whole, None, self.norm, plan), out, getattr(plan, "head_in", None))
        carry = None
        n = len(self._layer_kv)
        for li, (layer, kc, vc) in enumerate(self._layer_kv):
            x, q = be.layer_in(layer, kc, vc, x, carry, plan)
            if li == n - 1:  # past its KV write, a prefill's last layer matters for its last rows only
                q, x, plan = be.last_rows(q, x, plan) or (q, x, plan)
            o = be.attention(q, kc, vc, plan)
            x, carry = be.layer_out(layer, x, o, plan)
            if per and (li + 1) % per == 0 and li + 1 < n:
                yield
        return self.logits(be.final(x, carry, self.norm, plan), out, getattr(plan, "head_in", None))

    def logits(self, h: torch.Tensor, out: torch.Tensor | None = None, h_low: torch.Tensor | None = None) -> torch.Tensor:
        """h: [N, hidden] float32, normed -> [N, local vocab] float32: in out where the head's
        refinement writes them there (backend.refine), else a tensor of their own. h_low: h in a
        low precision already (the backend's final norm wrote it too), used where it is the head's."""
        if self.lm_head_q4 is None and self.lm_head_lowp is None:
            return F.linear(h, self.lm_head)
        # Low-precision logits for the whole vocabulary, then the best few recomputed in
        # float32, so greedy choices and the top logprobs are exact.
        q4, lowp = self.lm_head_q4, self.lm_head_lowp
        head = q4 if q4 is not None and (h.shape[0] <= 4 or lowp is None) else None
        if head is None and (h_low is None or h_low.dtype != lowp.dtype):  # type: ignore[union-attr]
            h_low = h.to(lowp.dtype)  # type: ignore[union-attr]
        raw = head(h) if head is not None else F.linear(h_low, lowp)
        return self.backend.refine(raw, self.lm_head, h, REFINE, out)


def weight_bytes_per_token(m: Decoder) -> int:
    """Bytes a batch-1 decode step must read (dense weights): every projection, the norms, the
    low-precision LM head, one embedding row and the refined LM-head rows (the GPU benches'
    bandwidth bound)."""
    n = 0
    for layer in m.layers:
        for t in (layer.qkv.w, layer.o.w, layer.gate_up.w, layer.down.w, layer.ln1, layer.ln2, layer.qkv.b):  # type: ignore[union-attr]
            if t is not None:
                n += t.numel() * t.element_size()
    head = m.lm_head_lowp if m.lm_head_lowp is not None else m.lm_head
    n += head.numel() * head.element_size() + m.norm.numel() * 4
    n += (1 + (REFINE if m.lm_head_lowp is not None else 0)) * m.embed.shape[1] * 4
    return n


def drain(gen: Generator[None, None, torch.Tensor]) -> torch.Tensor:
    """Run a step's generator to its end; its value."""
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value
