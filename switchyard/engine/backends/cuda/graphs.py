"""CUDA graphs for decode steps: one graph per (batch bucket, context bucket), captured on
first use and replayed afterwards.

A decode step is a fixed sequence of a few hundred small kernels; replaying it as one graph
removes the per-kernel launch cost, which at batch 1 is as large as the time spent reading
the weights. The step function must read its inputs from and write its outputs to static
buffers, and must not synchronise with the host (no .item(), no .tolist(), no data-dependent
shapes): the model's decode core is written that way. Collectives inside the step (TP>1,
NCCL or symmetric-memory all-reduce) are captured with it.

On a CPU device, or with graphs disabled, `run` just calls the step: the same code path,
eagerly, which is how the tests exercise it without a GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import torch

log = logging.getLogger("switchyard.engine.backends.cuda.graphs")

# Decode batch buckets (sequence slots). Padding a step up to the next bucket costs little
# while decode is bound by weight reads; more buckets would cost capture time and memory.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
MIN_LEN_BUCKET = 256


def batch_bucket(n: int, max_slots: int) -> int:
    """The smallest bucket that holds n slots, never more than max_slots."""
    for b in BATCH_BUCKETS:
        if b >= n:
            return min(b, max_slots)
    return max_slots


def len_bucket(n: int, max_len: int) -> int:
    """Attention span for a step whose longest context is n: a power of two >= 256, capped."""
    b = MIN_LEN_BUCKET
    while b < n:
        b *= 2
    return min(b, max_len)


class DecodeGraphs:
    """Capture-on-first-use cache of decode-step graphs sharing one memory pool."""

    def __init__(self, step: Callable[[int, int], Iterator[None]], device: torch.device, enabled: bool,
                 warmup: int = 2, capturable: Callable[[int], bool] = lambda batch: True) -> None:
        self.step = step
        self.device = device
        self.enabled = enabled and device.type == "cuda" and torch.cuda.is_available()
        self.may_capture = capturable  # batch bucket -> may its step (its collectives) be captured
        self.eager_batches: set[int] = set()
        self.warmup = warmup
        # Each step may be several graphs (the step function yields between parts), replayed in order.
        self.graphs: dict[tuple[int, int], list[torch.cuda.CUDAGraph]] = {}
        self.capture_seconds = 0.0
        self._pool: object | None = None

    def run(self, batch: int, span: int) -> None:
        if not self.enabled or not self._capturable(batch):
            for _ in self.step(batch, span):
                pass
            return
        parts = self.graphs.get((batch, span))
        if parts is None:
            self._capture(batch, span)  # its warm-up runs already produced this step's outputs
            return
        for g in parts:
            g.replay()

    def _capturable(self, batch: int) -> bool:
        if batch in self.eager_batches:
            return False
        if self.may_capture(batch):
            return True
        self.eager_batches.add(batch)
        log.warning("decode steps of batch bucket %d run without CUDA graphs: their all-reduces go "
                    "through NCCL (see comm.RingBackend.graph_safe)", batch)
        return False

    def _capture(self, batch: int, span: int) -> None:
        # The step is idempotent for fixed inputs (it rewrites the same KV entries with the
        # same values), so warming up on the live inputs is harmless and leaves the outputs.
        start = time.perf_counter()
        cur = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                for _ in self.step(batch, span):
                    pass
        cur.wait_stream(side)
        # Tensors passed from one part to the next live in the generator's frame during
        # capture and in the shared pool afterwards; parts always replay in capture order.
        parts: list[torch.cuda.CUDAGraph] = []
        gen = self.step(batch, span)
        done = False
        while not done:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self._pool):
                try:
                    next(gen)
                except StopIteration:
                    done = True
            if self._pool is None:
                self._pool = g.pool()
            parts.append(g)
        for g in parts:
            g.replay()
        self.graphs[(batch, span)] = parts
        took = time.perf_counter() - start
        self.capture_seconds += took
        log.info("captured decode graph batch=%d span=%d (%d parts) in %.2fs (%d buckets)", batch, span,
                 len(parts), took, len(self.graphs))

    def clear(self) -> None:
        self.graphs.clear()
        self._pool = None
