"""The torch backend's elementwise pieces (backends/torch_backend.py), fused by torch.compile
where it works.

Unfused, a decode layer runs ~25 tiny kernels (norm, RoPE, casts, SiLU, residual adds);
at batch 1 their fixed cost rivals the time to read the layer's weights. Each function
here is one fusion group. They are compiled with dynamic shapes (one compile per model
shape, not per batch size) on CUDA only; any compile failure is logged and that function
runs eagerly from then on, so a missing or broken compiler costs speed, never a request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger("switchyard.engine.backends.torch_ops")

NO_COMPILE_ENV = "SWITCHYARD_NO_COMPILE"


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.dtype) -> torch.Tensor:
    """RMSNorm in float32, as the CPU model computes it (x and w float32), cast to `out`."""
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(out)


def add_rms(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, eps: float,
            out: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add (float32 stream) fused with the next RMSNorm: (new x, normed input)."""
    x = x + y.float()
    return x, rms_norm(x, w, eps, out)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split RoPE of the last dimension (cos and sin broadcast to x)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
             head_dim: int, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
             out: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a fused QKV row block [N, (H + 2 Hkv) D], optional q/k RMSNorm (Qwen3), rotate q
    and k in float32 (half-split RoPE), cast to the cache dtype. Returns q [N,H,D], k, v [N,Hkv,D]."""
    n = qkv.shape[0]
    qk_width = (heads + kv_heads) * head_dim
    q = qkv[:, : heads * head_dim].float().view(n, heads, head_dim)
    k = qkv[:, heads * head_dim: qk_width].float().view(n, kv_heads, head_dim)
    if q_norm is not None and k_norm is not None:
        q = rms_norm(q, q_norm, eps, torch.float32)
        k = rms_norm(k, k_norm, eps, torch.float32)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = rotate(q, c, s), rotate(k, c, s)
    v = qkv[:, qk_width:].reshape(n, kv_heads, head_dim).to(out)
    return q.to(out), k.to(out), v


def masked_softmax(scores: torch.Tensor, bias: torch.Tensor, scale: float, out: torch.dtype) -> torch.Tensor:
    """Attention probabilities in float32 from raw scores and an additive mask, cast to `out`."""
    return torch.softmax(scores.float() * scale + bias, dim=-1).to(out)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


class Fused:
    """A function that runs compiled when it can and eagerly when it cannot.

    The first call of the compiled form compiles it; if that raises, the eager form is used
    from then on (logged once). Compile errors surface at the first call, which is always
    a warm-up before any CUDA graph capture, never inside one.
    """

    def __init__(self, fn: Callable[..., Any], enabled: bool) -> None:
        self.eager = fn
        self.name = fn.__name__
        self.compiled: Callable[..., Any] | None = None
        self.error = ""
        if enabled:
            try:
                self.compiled = torch.compile(fn, dynamic=True, fullgraph=True)
            except Exception as e:  # no inductor/triton in this build
                self._give_up(e)

    def _give_up(self, e: BaseException) -> None:
        self.error = f"{type(e).__name__}: {e}"[:300]
        self.compiled = None
        log.warning("torch.compile of %s failed, running it eagerly: %s", self.name, self.error)

    def __call__(self, *args: Any) -> Any:
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as e:
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    raise  # never fall back half-way through a graph capture
                self._give_up(e)
        return self.eager(*args)


class Ops:
    """The fused ops of one model: compiled on CUDA unless SWITCHYARD_NO_COMPILE is set."""

    def __init__(self, device: torch.device, compile_ops: bool | None = None) -> None:
        if compile_ops is None:
            compile_ops = device.type == "cuda" and os.environ.get(NO_COMPILE_ENV, "") in ("", "0")
        self.compiled = compile_ops
        if compile_ops:
            # One compile per model shape and per size-1 specialisation; the default limit (8)
            # is too small for two models in one process (the benchmark).
            import torch._dynamo.config as dynamo_config

            for knob in ("recompile_limit", "cache_size_limit"):
                if hasattr(dynamo_config, knob):
                    setattr(dynamo_config, knob, max(64, getattr(dynamo_config, knob)))
        self.add_rms = Fused(add_rms, compile_ops)
        self.rope_qkv = Fused(rope_qkv, compile_ops)
        self.silu_mul = Fused(silu_mul, compile_ops)
        self.masked_softmax = Fused(masked_softmax, compile_ops)

    def status(self) -> dict[str, str]:
        return {f.name: ("compiled" if f.compiled is not None else f"eager{': ' + f.error if f.error else ''}")
                for f in (self.add_rms, self.rope_qkv, self.silu_mul)}  # masked_softmax: bmm attention only
