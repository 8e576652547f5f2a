"""Which GPU a rank uses, and whether the Triton kernels can run at all."""

from __future__ import annotations

import torch


def have_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def rank_device(rank: int) -> torch.device:
    """This rank's GPU: LOCAL_RANK (torchrun) or the rank, modulo the visible GPUs; made current
    so that NCCL and every allocation without an explicit device land on it."""
    import os

    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cuda", local % max(1, torch.cuda.device_count()))
    torch.cuda.set_device(dev)
    return dev
