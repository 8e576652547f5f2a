"""Host <-> device copies that never make the host wait for the device's queue.

A GPU step is queued, not run, when the host returns from launching it; the engine overlaps its
own work (the output stage, the next step's inputs, grammar masks) with it. Three things would
silently wait for everything queued before them: `torch.tensor(..., device=cuda)` and
`.to(cuda)` from pageable memory without non_blocking (a synchronising copy), a device-to-host
copy into pageable memory, and reading a device value on the host (`.item()`, `.tolist()`).
So values go up from pinned memory, non-blocking, and come down into pinned memory behind an
event that the host waits on only when it needs them. On a CPU device each is a plain tensor.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch


def upload(values: Sequence[int] | Sequence[float] | torch.Tensor, dtype: torch.dtype,
           device: torch.device) -> torch.Tensor:
    """A small host list (or CPU tensor) on `device`, queued behind the device's work: the host
    does not wait. The pinned staging tensor is kept alive by torch's host allocator until the
    copy has run."""
    if not isinstance(values, torch.Tensor):
        t = torch.tensor(values, dtype=dtype)
        return t if device.type == "cpu" else t.pin_memory().to(device, non_blocking=True)
    t = values.to(dtype)
    if device.type == "cpu":
        return t
    # A tensor already pinned (a buffer the caller keeps, e.g. the grammar masks): no staging copy.
    return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)


class Download:
    """Device tensors copied to pinned host memory in the device's queue; `get()` waits for that
    copy alone (an event), then gives the host tensors. On a CPU device they are the tensors.
    `pool`: where the pinned buffers and the event come from (a new pinned tensor and a new event
    each, without one)."""

    def __init__(self, tensors: Sequence[torch.Tensor], pool: DownloadPool | None = None) -> None:
        self.event: torch.cuda.Event | None = None
        if not tensors or tensors[0].device.type == "cpu":
            self.host = list(tensors)
            return
        if pool is None:
            self.host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            self.event = torch.cuda.Event()
        else:
            self.host, self.event = [pool.buffer(t) for t in tensors], pool.event()
        for h, t in zip(self.host, tensors, strict=True):
            h.copy_(t, non_blocking=True)
        self.event.record()

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def get(self) -> list[torch.Tensor]:
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        return self.host


class DownloadPool:
    """Pinned buffers and events for a stream of Downloads, each reused `depth` Downloads later.

    A step's download is on every token's path: a new pinned tensor and a new event cost the
    host ~31 us a step where reused ones cost ~12-16 (an H100's host, bench/host_launch_costs.py),
    at SmolLM2's batch 1 a twentieth of the step. The caller's promise: a Download is read (get)
    before `depth` more of its shape and dtype, and `depth` more Downloads, are started (the
    engine reads each step's download before it starts the next one's)."""

    MAX_SHAPES = 64

    def __init__(self, depth: int = 4) -> None:
        self.depth = depth
        self._buffers: dict[tuple[tuple[int, ...], torch.dtype], tuple[list[torch.Tensor], itertools.count[int]]] = {}
        self._events = [torch.cuda.Event() for _ in range(depth)]
        self._turn = itertools.count()

    def buffer(self, like: torch.Tensor) -> torch.Tensor:
        key = (tuple(like.shape), like.dtype)
        ring = self._buffers.get(key)
        if ring is None:
            if len(self._buffers) >= self.MAX_SHAPES:  # logprobs' many shapes: start again (a buffer
                self._buffers.clear()                  # still being read is its Download's to keep)
            ring = self._buffers[key] = ([torch.empty(like.shape, dtype=like.dtype, pin_memory=True)
                                          for _ in range(self.depth)], itertools.count())
        return ring[0][next(ring[1]) % self.depth]

    def event(self) -> torch.cuda.Event:
        return self._events[next(self._turn) % self.depth]
