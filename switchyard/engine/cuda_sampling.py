"""Sampling on the device that holds the logits.

A request's seeded generator lives on the CPU (it is made before the request has a device);
on a GPU the draw stays on the CPU generator (one uniform number, so a seed still fixes the
result) and the categorical choice runs on the GPU by inverting the CDF, without copying the
vocabulary-sized row to the host.
"""

from __future__ import annotations

import torch


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a probability row (any device)."""
    if probs.device.type == "cpu":
        return int(torch.multinomial(probs, 1, generator=generator).item())
    return int(inverse_cdf(probs, torch.rand(1, generator=generator, dtype=torch.float64)).item())


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The index i with cdf[i-1] <= u * total < cdf[i], computed where `probs` lives."""
    cdf = probs.double().cumsum(-1)
    return torch.searchsorted(cdf, u.to(probs.device) * cdf[-1], right=True).clamp_(max=probs.shape[-1] - 1)
