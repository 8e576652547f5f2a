"""A slot-space decoder's start-up, before it serves: the cuda backend checked against the torch
backend over the same weights and cache (as the collectives have their start-up test), the
decode graphs of every batch bucket captured, and what the backend compiles per shape compiled.

With --prefill-fp8, the FP8 projections are checked too. The backend check's 8-token prefill is
below fp8.PREFILL_TOKENS, so it compares bf16 with bf16 as before; the FP8 check runs each
projection's FP8 copy (the quantisation kernels and _scaled_mm on the real shapes) against bf16 on
a few rows, so that a GPU or torch build without the FP8 kernels is refused at start-up rather
than failing the first long prompt."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import torch

from switchyard.engine.backends.base import Backend
from switchyard.engine.backends.cuda.graphs import BATCH_BUCKETS, batch_bucket
from switchyard.engine.errors import ConfigError
from switchyard.engine.model.step import Step

log = logging.getLogger("switchyard.engine.model.warmup")
CHECKED = {"cuda": "torch"}  # a backend -> the one its start-up check holds it to


class Decoder(Protocol):
    """What the warm-up needs of model/decoder.Decoder (which imports this module when warmed)."""

    backend: Backend
    backend_name: str
    backend_reason: str
    prefill_fp8: bool
    layers: list[Any]
    max_slots: int
    device: torch.device
    k_cache: torch.Tensor | None
    v_cache: torch.Tensor | None

    def forward(self, step: Step) -> torch.Tensor: ...

    def view(self, backend: str, *, max_slots: int = 1) -> Decoder: ...

    def use_backend(self, name: str, reason: str = "") -> None: ...


def warmup(m: Decoder) -> float:
    """Check the backend, then capture the decode graphs of every batch bucket (at the shortest
    span) before serving, so the first requests do not pay for them. Writes only into slots 0 and
    1's blocks (and the spare), which no request reads before its own prefill or decode writes them
    (the scheduler's pool has no keys for them). Every TP rank must call it (its collectives pair
    up). Returns the seconds it took."""
    start = time.perf_counter()
    n = 8
    one = torch.ones(1, dtype=torch.int64)
    if m.backend_name in CHECKED:
        reference = CHECKED[m.backend_name]
        why = check_backend(m, reference, n)
        if why:
            log.warning("%s; decoding with the %s backend", why, reference)
            m.use_backend(reference, why)
    if m.prefill_fp8:  # an option asked for and not honoured is refused, not ignored
        if m.backend_name != "cuda":
            raise ConfigError(f"--prefill-fp8 runs on the cuda backend, which gave way to {m.backend_name}: "
                              f"{m.backend_reason}")
        from switchyard.engine.backends.cuda import fp8

        why = fp8.check(m.layers)
        if why:
            raise ConfigError(f"--prefill-fp8: {why}")
    m.forward(Step(torch.zeros(1, n, dtype=torch.int64), torch.arange(n).view(1, n), torch.zeros_like(one),
                   one * n, one * n, 0))
    for S in sorted({batch_bucket(b, m.max_slots) for b in BATCH_BUCKETS if b <= m.max_slots} | {m.max_slots}):
        m.forward(Step(torch.zeros(1, 1, dtype=torch.int64), (one * n).view(1, 1), torch.zeros_like(one), one,
                       one * (n + 1), S))
    m.backend.warm(m.k_cache[0], m.v_cache[0], m.max_slots)  # type: ignore[index]
    if m.device.type == "cuda":
        torch.cuda.synchronize(m.device)
    return time.perf_counter() - start


def check_backend(m: Decoder, reference: str, n: int, tol: float = 0.5) -> str:
    """m's backend against `reference` over m's weights and cache, graphs off: a prefill of slot 0,
    a decode step of it, then one of it and slot 1's first position, through each. "" when they
    agree, else why not: a failure, or logits further apart than `tol` x their std. It catches a kernel that computes something else (NaN,
    or logits a std or more apart), not rounding: two bfloat16 paths over a random 8B model's 32
    layers differ by 0.18-0.25 x std on an H200 (the accuracy bound against the float32 engine is
    the GPU tests' job)."""
    one = torch.ones(1, dtype=torch.int64)
    prompt = Step(torch.arange(n).view(1, n) % 7, torch.arange(n).view(1, n), torch.zeros_like(one), one * n, one * n)
    decode = Step(torch.tensor([[3]]), (one * n).view(1, 1), torch.zeros_like(one), one, one * (n + 1), 1)
    steps = [("prefill", prompt), ("decode", decode)]
    if m.max_slots > 1:  # one row and 2-16 rows run different kernels (cuda: kernels.py's M_P = 1 and 16)
        two = torch.ones(2, dtype=torch.int64)
        steps.append(("two-row decode", Step(torch.tensor([[3], [5]]), torch.tensor([[n + 1], [0]]),
                                             torch.tensor([0, 1]), two, torch.tensor([n + 2, 1]), 2)))
    rows = min(2, m.max_slots)
    ref, test = m.view(reference, max_slots=rows), m.view(m.backend_name, max_slots=rows)
    what = "prefill"
    try:
        for what, step in steps:
            want = ref.forward(step).float()
            err = float((test.forward(step).float() - want).abs().max() / want.std())
            if not err <= tol:  # NaN too
                return f"{m.backend_name} backend's {what} check: logits {err:.3g} x std from the {reference} backend's"
    except Exception as e:  # a kernel that does not compile or launch on this device
        return f"{m.backend_name} backend's {what} check failed: {type(e).__name__}: {e}"[:300]
    return ""
