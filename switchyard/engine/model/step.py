"""One step's input, built once by rank 0's scheduler, broadcast whole by the runner
(runner/broadcast.py) and passed whole to the decoder's forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Step:
    """ids/positions: [B, T] (right-padded when T > 1: a prefill, each row either a new prompt
    from position 0 or the continuation of one whose start is already cached); lens: [B] valid
    new tokens per row; ctx_lens: [B] cached tokens after this step; tables: [B, W] int64, the
    KV blocks holding each row's positions (None: each slot's fixed run, model.slot_tables);
    slots and view_slots: the decode rows (the GPU decoder runs decode steps in slot space over
    slots 0..view_slots-1). keep_logits False: the caller queues its work on the step's logits
    before it launches the next step, so they may be a view of a buffer that step overwrites (the
    graph runner's output, without a copy); rank 0's scheduler says so, its followers never read
    theirs."""

    ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    lens: torch.Tensor
    ctx_lens: torch.Tensor
    view_slots: int = 0
    tables: torch.Tensor | None = None
    keep_logits: bool = True

    @classmethod
    def of(cls, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor,
           ctx_lens: torch.Tensor, view_slots: int = 0, tables: torch.Tensor | None = None) -> Step:
        return cls(ids, positions, slots, lens, ctx_lens, view_slots, tables)

    @property
    def B(self) -> int:
        return int(self.ids.shape[0])

    @property
    def T(self) -> int:
        return int(self.ids.shape[1])

    @property
    def num_tokens(self) -> int:
        return self.ids.numel()
