"""Decode steps in slot space, replayed as CUDA graphs: how the decoder runs a decode step on
a backend with slot_decode (torch, cuda).

- A step covers decode slots 0..S-1 (S = a batch bucket >= the highest live slot + 1), so that
  its shapes depend only on (S, span bucket) and it can be captured once per bucket. Slots not in
  the step write their keys and values into the cache's spare block (index num_blocks), which no
  live row attends to, and their logits are dropped.
- The step reads token ids, positions, context lengths and block tables from one static device
  buffer and writes logits into a static buffer: no host synchronisation inside a step, one
  host-to-device copy before it and one gather after it. The inputs of a step over S slots and
  nb blocks a row lie in the buffer's first (4 + nb) * S entries (ids, positions, ctx lens, each
  row's slot, then the tables), so that the copy is of one contiguous run: torch copies a
  strided host view through a pageable temporary and a copy kernel. The host stages those
  inputs in one of two pinned buffers, in turn, so that staging a step never waits for the copy
  of the step before it.
- Token ids that already live on the device (async decode: the previous step's sampled tokens,
  which the host has not read) are copied into the ids buffer there, row by row into their
  slots, after the staged inputs; host ids are staged with the rest. On a CPU device every
  tensor is on the device, so the CPU tests run the device copy.
- The step may be captured in several graphs (GRAPH_PARTS; the decoder's layer loop yields between
  them), so that the GPU starts on the first part while the host still launches the next ones.
  Served as one: under async decode the host queues a step while the one before runs, and a
  graph's first kernel cannot overlap the last one's of the graph before it (PDL works within a
  graph), so on an H100 one graph ran SmolLM2's batch-1 step in 0.420 ms against 0.437 for four
  (bench/results/gpu_head/).

On a CPU device, or with graphs off, the same step runs eagerly (backends/cuda/graphs.py), which
is how the CPU tests check it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
import torch

from switchyard.engine.backends.base import ModelDims
from switchyard.engine.backends.cuda.graphs import DecodeGraphs, batch_bucket, len_bucket
from switchyard.engine.model.parallel import CollectiveBackend
from switchyard.engine.model.step import Step

GRAPH_PARTS = 1  # graphs a decode step is captured in (4 before PDL and async decode: bench/engine_cuda_probe.py)
# decode(ids, pos, ctx, tables, span, graphs on, layers a part, out) -> a generator yielding between
# parts and returning the step's logits, in out where it could write them there: Decoder.decode_step.
DecodeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, bool, int, torch.Tensor],
                    Generator[None, None, torch.Tensor]]


class GraphRunner:
    VIEWS = True  # logits a step need not keep (Step.keep_logits) as a view of the static output (False: a copy)

    def __init__(self, dims: ModelDims, decode: DecodeFn, max_slots: int, vocab: int, layers: int, cuda_graphs: bool,
                 parts: int | None = None) -> None:
        self.d, self.decode, self.max_slots, self.layers = dims, decode, max_slots, layers
        self.parts = parts or GRAPH_PARTS
        dev, bs = dims.device, dims.block_size
        self.blocks_per_seq = bps = -(-dims.max_len // bs)
        comm: CollectiveBackend = dims.comm  # type: ignore[assignment]
        # A decode step's largest all-reduce: the embedding rows, float32, per batch slot.
        self.graphs = DecodeGraphs(self._step, dev, cuda_graphs,
                                   capturable=lambda batch: comm.graph_safe(batch * dims.hidden * 4))
        # A step's inputs, laid out by its shape (_layout): ids, positions, ctx lens by slot, each
        # row's slot (the device copy's and the logits gather's index), block tables [S, nb].
        size = (4 + bps) * max_slots
        self.inputs = torch.zeros(size, dtype=torch.int64, device=dev)
        self.step_out = torch.zeros(max_slots, vocab, dtype=torch.float32, device=dev)
        pin = dev.type == "cuda"
        # Two staging buffers, used in turn; numpy views of the same memory.
        self._host = [torch.zeros(size, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._host_np = [h.numpy() for h in self._host]
        self._iota_np = np.arange(max(max_slots, bps), dtype=np.int64)  # slot and block ids
        # Each buffer's copy, queued: an event a buffer, recorded again each time it is used (a new
        # event a step cost the host ~8-11 us, bench/host_launch_costs.py). One not yet recorded
        # has nothing to wait for: torch makes the CUDA event at its first record.
        self._staged = [torch.cuda.Event() for _ in range(2)] if pin else []
        self._turn = 0

    def status(self) -> dict[str, Any]:
        return {"cuda_graphs": self.graphs.enabled, "graphs_captured": len(self.graphs.graphs),
                "eager_batch_buckets": sorted(self.graphs.eager_batches)}

    def run(self, step: Step) -> torch.Tensor:
        """A decode step (T = 1): the logits of its rows, a view of the static output where the
        step says it need not keep them (Step.keep_logits) and its rows are slots 0..B-1, else a
        tensor of their own. Never waits for the device."""
        d = self.d
        ids, positions, slots, block_tables = step.ids, step.positions, step.slots, step.tables
        B = ids.shape[0]
        # Ids on the model's device are copied there, never read by the host (`cuda` and `cuda:0`
        # are one device: compare kinds, not names).
        on_device = not ids.is_cpu or d.device.type == "cpu"
        # A decode step's host work is on every token's path (at batch 1 it rivals a small
        # model's whole GPU step), so it stages the inputs with numpy on the pinned buffers'
        # memory: a third of the time of the same dozen torch calls.
        slot_np = slots.cpu().numpy()
        ctx_np = step.ctx_lens.cpu().numpy()
        S = batch_bucket(max(step.view_slots, int(slot_np.max()) + 1), self.max_slots)
        # The span: a bucket of whole blocks, so that it splits into each row's blocks.
        L = -(-len_bucket(int(ctx_np.max()), d.max_len) // d.block_size) * d.block_size
        nb = L // d.block_size
        k = self._turn
        self._turn ^= 1
        if self._staged:
            self._staged[k].synchronize()  # this buffer's copy (two steps back) has left it
        n = (4 + nb) * S  # _layout's extent
        staged, staged_tables = _layout(self._host_np[k], S, nb)
        staged[:] = 0  # slots outside this step: token 0 at position 0 of the spare block
        if not on_device:
            staged[0, slot_np] = ids.numpy()[:, 0]
        staged[1, slot_np] = positions.cpu().numpy()[:, 0]
        staged[2, slot_np] = ctx_np
        staged[3, :B] = slot_np
        staged_tables.fill(d.num_blocks)
        if block_tables is None:  # slot s owns blocks s * blocks_per_seq onwards
            staged_tables[slot_np] = slot_np[:, None] * self.blocks_per_seq + self._iota_np[:nb]
        else:
            tables = block_tables.cpu().numpy()
            w = min(nb, tables.shape[1])
            staged_tables[slot_np, :w] = tables[:, :w]
        self.inputs[:n].copy_(self._host[k][:n], non_blocking=True)
        if self._staged:
            self._staged[k].record()
        in_order = bool((slot_np == self._iota_np[:B]).all())  # slots 0..B-1: no scatter, no gather
        row_slots = self.inputs[3 * S: 3 * S + B]  # _layout's rows[3, :B], in one slice: every step's path
        if on_device:  # the step's ids lead the buffer: slot s's at entry s
            if in_order:
                self.inputs[:B].copy_(ids.view(-1))
            else:
                self.inputs[:S].index_copy_(0, row_slots, ids.view(-1))
        self.graphs.run(S, L)
        if in_order:  # the copy a step cost SmolLM2's batch-1 step ~2.5 us on an H100's GPU
            return self.step_out[:B] if self.VIEWS and not step.keep_logits else self.step_out[:B].clone()
        return self.step_out.index_select(0, row_slots)

    def _step(self, S: int, L: int) -> Iterator[None]:
        """One decode step over slots 0..S-1 attending over positions 0..L-1, from inputs to
        step_out, with no host synchronisation: what a CUDA graph records, in parts."""
        per = max(1, -(-self.layers // max(1, self.parts)))
        rows, tables = _layout(self.inputs, S, L // self.d.block_size)
        out = self.step_out[:S]
        logits = yield from self.decode(rows[0], rows[1], rows[2], tables, L, self.graphs.enabled, per, out)
        if logits.data_ptr() != out.data_ptr():  # the head wrote them elsewhere (backend.refine)
            out.copy_(logits)


def _layout(buf: Any, S: int, nb: int) -> tuple[Any, Any]:
    """A step's inputs over S slots and nb blocks a row, in the first (4 + nb) * S entries of buf
    (the device buffer the graphs read, or a host staging buffer as numpy): rows [4, S] (ids,
    positions, ctx lens, each row's slot) and the block tables [S, nb], views at fixed offsets."""
    return buf[: 4 * S].reshape(4, S), buf[4 * S: (4 + nb) * S].reshape(S, nb)
