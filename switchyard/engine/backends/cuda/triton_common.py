"""What the Triton kernels share: interpretation without a GPU (set before triton loads) and
a tile product that the interpreter computes right."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # read when the kernels below are defined: interpret them
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET", "") == "1"  # kernels run in Triton's interpreter
# Triton's interpreter multiplies bfloat16 tiles wrongly in tl.dot (numpy has no bfloat16), so
# interpreted kernels upcast both operands first: the same products (a bfloat16 product is exact
# in float32), summed in float32 as the tensor cores do.
_UPCAST = INTERPRETED


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on `device` may be launched with programmatic dependent launch (PDL): a
    compiled kernel (the interpreter runs no PTX) on Hopper or later. A PDL kernel starts while
    the kernel before it still runs, loads what does not depend on it (its weight tile), then
    waits at gdc_wait for it to finish: at batch 1 a small model's step is ~180 such kernels of
    2-4 us, where the gap between two is most of the time."""
    return not INTERPRETED and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def _pdl_wait(PDL: tl.constexpr):
    """Wait for the kernel before to finish (and with it every kernel before that, each having
    waited for its own): a PDL kernel reads nothing a kernel before it wrote, and writes
    nothing, before this. Then let the next kernel launch: it loads its weights while this one
    works. Not earlier: a kernel that let the next launch before its own wait let a chain of
    launched kernels wait ahead, holding the multiprocessors' shared memory (SmolLM2 at 16 rows,
    whose tl.dot kernels prefetch nothing, ran 10% slower, bench/results/gpu_pdl/)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision="ieee")
