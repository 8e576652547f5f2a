"""A step's grammar masks applied to its logits: the rows that have a grammar keep the tokens
their bitmask allows and get -inf elsewhere.

CPU float32 logits take one native call (`native/token_mask.c`); anything else (GPU logits,
no native kernels) takes torch's ops on the logits' device, the bitmask copied there without the
host waiting (the async decode loop fills step n+1's masks while step n+1 runs). At batch
16 on 2 cores torch's bit unpacking took 20-60 ms where the native loop takes well under 1 ms.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from switchyard.engine.backends.cpu.native import load as load_native
from switchyard.engine.backends.transfer import upload

# Bit k of a word as an int32 (bit 31: the sign bit), to test all 32 with one AND; on each device.
_POW2 = torch.from_numpy(np.left_shift(np.int32(1), np.arange(32, dtype=np.int32)))
_POW2_ON: dict[torch.device, torch.Tensor] = {}


def _native_lib() -> ctypes.CDLL | None:
    lib = load_native()[0]
    if lib is not None and not getattr(lib.sy_token_mask, "argtypes", None):
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.sy_token_mask.argtypes = [p, i64, p, i64, p, i64]
        lib.sy_token_mask.restype = ctypes.c_int
    return lib


def apply_token_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Any device and dtype: the bits unpacked by torch's ops where the logits are (what the GPU
    path runs). The masked rows' bits go up from pinned memory, queued behind the step that
    makes the logits: the host never waits for the device here."""
    if not rows:
        return
    dev = logits.device
    B, V = logits.shape
    every = len(rows) == B and rows == list(range(B))
    bm = upload(bitmask[:B] if every else bitmask[rows], torch.int32, dev)
    blocked = (bm.unsqueeze(-1) & _pow2(dev)).view(len(rows), -1) == 0  # two kernels
    n = min(V, blocked.shape[1])
    idx = None if every else upload(rows, torch.int64, dev)
    target = logits if idx is None else logits.index_select(0, idx)
    target[:, :n].masked_fill_(blocked[:, :n], float("-inf"))
    if n < V:  # a vocabulary padded past the mask: never allowed
        target[:, n:] = float("-inf")
    if idx is not None:
        logits.index_copy_(0, idx, target)


def _pow2(dev: torch.device) -> torch.Tensor:
    t = _POW2_ON.get(dev)
    if t is None:
        t = _POW2_ON[dev] = upload(_POW2, torch.int32, dev)
    return t


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """logits [B, V] in place; bitmask int32 [>= B, W] on the CPU; rows: the masked rows."""
    if not rows:
        return
    lib = _native_lib() if logits.device.type == "cpu" else None  # GPU logits never compile the kernels
    if lib is not None and logits.dtype == torch.float32 and logits.is_contiguous() and bitmask.is_contiguous():
        idx = torch.tensor(rows, dtype=torch.int64)
        if not lib.sy_token_mask(logits.data_ptr(), logits.shape[1], bitmask.data_ptr(), bitmask.shape[1],
                                 idx.data_ptr(), len(rows)):
            return
    apply_token_bitmask_torch(logits, bitmask, rows)
