"""What the Triton kernels share: interpretation without a GPU (set before triton loads) and
a tile product that the interpreter computes right."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # read when the kernels below are defined: interpret them
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# Triton's interpreter multiplies bfloat16 tiles wrongly in tl.dot (numpy has no bfloat16), so
# interpreted kernels upcast both operands first: the same products (a bfloat16 product is exact
# in float32), summed in float32 as the tensor cores do.
_UPCAST = os.environ.get("TRITON_INTERPRET", "") == "1"


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision="ieee")
