"""What the decoder needs of the collectives: one all-reduce after each row-parallel
projection (and the vocab-parallel embedding), and whether one may be captured in a CUDA
graph. The backends themselves (ring, oneshot, auto) are runner/comm.py's."""

from __future__ import annotations

from typing import Protocol

import torch


class CollectiveBackend(Protocol):
    name: str

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor: ...

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor: ...

    def graph_safe(self, nbytes: int) -> bool:
        """Whether an all-reduce of nbytes may be captured in a CUDA graph."""
        ...


class SingleRank:
    """One rank: every collective is the identity."""

    name = "none"
    world = 1

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def graph_safe(self, nbytes: int) -> bool:
        return True
