"""Token choice from logits: greedy, temperature + top-p with a per-request seed, logprobs.

Sampling runs on the device that holds the logits. A request's seeded generator lives on the
CPU (it is made before the request has a device); on a GPU the draw stays on the CPU generator
(one uniform number, so a seed still fixes the result) and the categorical choice runs on the
GPU by inverting the CDF, without copying the vocabulary-sized row to the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from switchyard.engine.backends.cpu.native import load as load_native
from switchyard.engine.backends.cpu.rowops import topk_indices


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def make_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    g = torch.Generator()
    g.manual_seed(params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    return g


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of logits [B, V]."""
    # torch's argmax takes ~0.7 ms over 16 rows of a 49k vocabulary on 2 cores; ours ~0.05.
    # (GPU logits never load the CPU kernels: that would compile them on the first request.)
    lib = load_native()[0] if logits.device.type == "cpu" else None
    out = topk_indices(lib, logits, 1).view(-1).tolist()
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = logits[i] / p.temperature
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (always at least one token).
            drop = probs.cumsum(-1) - probs > p.top_p
            sorted_logits[drop] = float("-inf")
            row = torch.full_like(row, float("-inf")).scatter(0, order, sorted_logits)
        probs = torch.softmax(row, dim=-1)
        out[i] = draw(probs, generators[i])  # on the logits' device (GPU: inverse CDF)
    return out


def token_logprobs(logits: torch.Tensor, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = float(lp[token])
    if top <= 0:
        return chosen, []
    vals, idx = lp.topk(top)
    return chosen, list(zip(idx.tolist(), vals.tolist(), strict=True))


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a probability row (any device)."""
    if probs.device.type == "cpu":
        return int(torch.multinomial(probs, 1, generator=generator).item())
    return int(inverse_cdf(probs, torch.rand(1, generator=generator, dtype=torch.float64)).item())


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The index i with cdf[i-1] <= u * total < cdf[i], computed where `probs` lives."""
    cdf = probs.double().cumsum(-1)
    return torch.searchsorted(cdf, u.to(probs.device) * cdf[-1], right=True).clamp_(max=probs.shape[-1] - 1)
