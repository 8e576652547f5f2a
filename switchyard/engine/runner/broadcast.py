"""The step protocol between rank 0 and the followers, over a CPU (gloo) group: a header of
five integers (kind, B, T, view_slots, block-table width), then, for a step, its tensors in
one int64 payload. Rank 0's pool decides the block tables; every rank's cache follows them."""

from __future__ import annotations

import torch
import torch.distributed as dist

from switchyard.engine.model.step import Step

HEARTBEAT, STEP, STOP = 0, 1, 2
_HEADER = 5  # kind, B, T, view_slots, block table width


def send(kind: int, group: dist.ProcessGroup | None, step: Step | None = None) -> None:
    """Rank 0: tell the followers what comes next (a step must carry its block tables)."""
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0] = kind
    if step is not None:
        assert step.tables is not None, "a broadcast step carries its block tables"
        header[1], header[2], header[3], header[4] = step.B, step.T, step.view_slots, step.tables.shape[1]
    dist.broadcast(header, src=0, group=group)
    if step is not None:
        payload = torch.cat([step.ids.reshape(-1), step.positions.reshape(-1), step.slots, step.lens,
                             step.ctx_lens, step.tables.reshape(-1)])  # type: ignore[union-attr]
        dist.broadcast(payload, src=0, group=group)


def receive(group: dist.ProcessGroup | None) -> tuple[int, Step | None]:
    """A follower: the next kind and, for STEP, the step it carries."""
    header = torch.zeros(_HEADER, dtype=torch.int64)
    dist.broadcast(header, src=0, group=group)
    kind = int(header[0])
    if kind != STEP:
        return kind, None
    B, T, view_slots, W = (int(v) for v in header[1:])
    payload = torch.empty(2 * B * T + 3 * B + B * W, dtype=torch.int64)
    dist.broadcast(payload, src=0, group=group)
    ids, positions, slots, lens, ctx_lens, tables = payload.split([B * T, B * T, B, B, B, B * W])
    return kind, Step(ids.view(B, T), positions.view(B, T), slots, lens, ctx_lens, view_slots, tables.view(B, W))
