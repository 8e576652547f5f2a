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
    copy alone (an event), then gives the host tensors. On a CPU device they are the tensors."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.event: torch.cuda.Event | None = None
        if not tensors or tensors[0].device.type == "cpu":
            self.host = list(tensors)
            return
        self.host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True) for t in tensors]
        self.event = torch.cuda.Event()
        self.event.record()

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def get(self) -> list[torch.Tensor]:
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        return self.host
