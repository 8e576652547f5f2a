"""What the one decoder (model/decoder.py) asks of a backend, and the model facts a backend is
built from.

The decoder owns the weights, the KV cache, the RoPE tables, the embedding and the logits; it
runs every layer as the same three calls, and a backend says how each runs on its device:

  x, q     = layer_in(layer, kc, vc, x, carry, plan)   the residual's pending add and RMSNorm,
                                                       QKV, RoPE (and, where fused, the KV write)
  o        = attention(q, kc, vc, plan)                the KV write where still due, attention
  x, carry = layer_out(layer, x, o, plan)              o-proj, all-reduce, residual, RMSNorm, MLP,
                                                       all-reduce (carry: its output, added by the
                                                       next layer_in or by final)

unless `all_layers` runs the whole stack in one call (none of the served backends does; the
bench's `cuda-persistent` variant does at one row).

`plan` is the backend's own value for one step (what every layer's attention shares: where the
new keys go, masks, spans), made once by `plan` (an eager step) or `decode_plan` (a decode step
in slot space, model/graph_runner.py). Names map to backends in backends/registry.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


class AllReduce(Protocol):
    """The collectives a layer needs (runner/comm.py's backends, model/parallel.SingleRank)."""

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor: ...


class LayerWeights(Protocol):
    """One layer's weights (model/layer.py): norms float32, projections callable (dense or
    int4, model/linear.py); dense ones also hold their tensors (w, b) for kernels that read them."""

    ln1: torch.Tensor
    ln2: torch.Tensor
    qkv: Any
    o: Any
    gate_up: Any
    down: Any
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    qk_norm: torch.Tensor | None  # q_norm and k_norm in one buffer (the fused kernel reads both)


@dataclass(frozen=True)
class ModelDims:
    """What a backend knows of the model and cache it runs: one rank's head counts, the
    activations' dtype (the projections' input), the cache's geometry and the RoPE tables
    [max_len + 1, head_dim] float32 on the device. A backend is built for one cache: the
    decoder builds a new one when it reallocates the cache."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    eps: float
    tp: int
    device: torch.device
    dtype: torch.dtype
    block_size: int
    num_blocks: int
    max_len: int
    cos: torch.Tensor
    sin: torch.Tensor
    comm: AllReduce

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class EagerInput:
    """An eager step as the decoder hands it to `plan`: ids/positions [B, T] (right-padded),
    lens [B] new tokens per row, ctx_lens [B] cached positions after the step, tables [B, W]
    the rows' KV blocks (CPU tensors, as the scheduler builds them)."""

    ids: torch.Tensor
    positions: torch.Tensor
    lens: torch.Tensor
    ctx_lens: torch.Tensor
    tables: torch.Tensor


@dataclass
class Plan:
    """The part of every backend's plan the decoder reads: the step's token ids, laid out and
    placed as the backend's layers take the residual stream."""

    ids: torch.Tensor


class Backend(Protocol):
    """See the module's docstring; backends/registry.py names them."""

    name: str
    slot_decode: bool  # decode steps in slot space over static buffers (model/graph_runner.py)
    chunked_prefill: bool  # a prefill may continue a prompt whose start is cached (else whole prompts)

    def kv_dtype(self, requested: str, fmt: str) -> torch.dtype: ...

    def plan(self, step: EagerInput) -> Plan: ...

    def decode_plan(self, ids: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor, tables: torch.Tensor, span: int,
                    graphs: bool) -> Plan:
        """A decode step over slots 0..S-1 (ids, pos, ctx [S], tables [S, span / block_size], all
        on the device, static buffers a CUDA graph records): only backends with slot_decode."""
        ...

    def layer_in(self, layer: LayerWeights, kc: torch.Tensor, vc: torch.Tensor, x: torch.Tensor,
                 carry: torch.Tensor | None, plan: Any) -> tuple[torch.Tensor, Any]: ...

    def attention(self, q: Any, kc: torch.Tensor, vc: torch.Tensor, plan: Any) -> torch.Tensor: ...

    def layer_out(self, layer: LayerWeights, x: torch.Tensor, o: torch.Tensor,
                  plan: Any) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def all_layers(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   plan: Any) -> torch.Tensor | None:
        """Every layer of the step in one call where the backend has one for it (the bench's
        cuda-persistent variant, one row): the residual before the final norm, with no carry; None: the decoder runs the layers one by one. k_cache/v_cache: every layer's,
        [layers, ...]."""
        ...

    def last_rows(self, q: Any, x: torch.Tensor, plan: Any) -> tuple[Any, torch.Tensor, Any] | None:
        """The last layer of a prefill, its keys and values written: (q, x, plan) narrowed to each
        prompt's last row, the only rows whose logits are read; None: every row goes on."""
        ...

    def final(self, x: torch.Tensor, carry: torch.Tensor | None, norm: torch.Tensor, plan: Any) -> torch.Tensor: ...

    def refine(self, raw: torch.Tensor, w: torch.Tensor, h: torch.Tensor, k: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """A low-precision head's logits raw [N, V] as float32, with each row's best k recomputed
        against the float32 head w [V, hidden] from h [N, hidden]. out: float32 [N, V] (rows
        contiguous) the backend may write them into (a graph's static output); returns where
        they are."""
        ...

    def status(self) -> dict[str, Any]: ...

    def warm(self, kc: torch.Tensor, vc: torch.Tensor, max_rows: int) -> None:
        """Compile what is compiled per shape, on one layer's cache, before serving decode steps
        of up to max_rows rows."""
        ...


def last_row_mask(fresh: bool, lens: torch.Tensor, T: int, ids: torch.Tensor, mask: Any) -> torch.Tensor:
    """backend.last_rows' attention mask [B, 1, 1, keys], each prompt's last row alone (lens: each prompt's new
    rows, on the mask's device): a fresh prompt's over the step's own T keys (ids: 0, 1, ... at least T long),
    its padding masked; a continued prompt's, its last row's line of the step's mask [B, 1, T, keys]."""
    B = lens.shape[0]
    if fresh:
        return (ids[:T].view(1, T) < lens.view(B, 1)).view(B, 1, 1, T)
    return mask[torch.arange(B, device=lens.device), :, lens - 1].unsqueeze(2)
