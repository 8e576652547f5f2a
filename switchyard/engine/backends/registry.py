"""The decoder's backends by name, and which one a device gets.

  cpu    native kernels (int4 matmuls, decode attention, fused layers, row ops), torch's ops where
         they cannot run; eager steps, chunked prefill            backends/cpu/backend.py
  torch  torch's ops on any device and at any TP width; decode in slot space, replayed as CUDA
         graphs on a GPU                                          backends/torch_backend.py
  cuda   the torch backend with Triton kernels: fused decode layers (up to 16 rows), paged
         decode attention, the prefill's RoPE and SiLU; one rank  backends/cuda/backend.py

A backend's module is imported when one is made (the cuda one loads triton). A bench that
compares variants registers its own subclass under a name of its own (`register`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from switchyard.engine.backends.base import Backend, LayerWeights, ModelDims
from switchyard.engine.backends.cuda.device import have_triton
from switchyard.engine.errors import ConfigError

_BACKENDS: dict[str, str | Callable[..., Backend]] = {
    "cpu": "switchyard.engine.backends.cpu.backend:CpuBackend",
    "torch": "switchyard.engine.backends.torch_backend:TorchBackend",
    "cuda": "switchyard.engine.backends.cuda.backend:CudaBackend",
}
FUSED_TP_REASON = "fused decode kernels run on one rank only (TP > 1 all-reduces mid-layer)"


def names() -> list[str]:
    return list(_BACKENDS)


def register(name: str, factory: Callable[..., Backend]) -> None:
    """A backend under a name of its own: factory(dims, layers) -> Backend."""
    _BACKENDS[name] = factory


def resolve(requested: str, device: torch.device | str, tp: int) -> tuple[str, str]:
    """(the backend to run, why not the one requested: "" when it is). `auto`: cpu on a CPU,
    cuda on a GPU; cuda gives way to torch at TP > 1 or without triton, as a GPU's start-up
    check may make it later (model/warmup.py)."""
    if requested not in ("auto", *_BACKENDS):
        raise ConfigError(f"decoder backend must be one of auto, {', '.join(_BACKENDS)}, got {requested!r}")
    dev = torch.device(device)
    if requested == "auto":
        requested = "cpu" if dev.type == "cpu" else "cuda"
    if requested == "cpu" and dev.type != "cpu":
        raise ConfigError(f"the cpu backend runs on a CPU, not on {dev}")
    if requested == "cuda":
        if tp > 1:
            return "torch", FUSED_TP_REASON
        if not have_triton():
            return "torch", "fused decode kernels need triton"
    return requested, ""


def make(name: str, dims: ModelDims, layers: Sequence[LayerWeights], **kw: Any) -> Backend:
    factory = _BACKENDS.get(name)
    if factory is None:
        raise ConfigError(f"no decoder backend named {name!r} ({', '.join(_BACKENDS)})")
    if isinstance(factory, str):
        module, cls = factory.split(":")
        factory = getattr(importlib.import_module(module), cls)
    return factory(dims, layers, **kw)
