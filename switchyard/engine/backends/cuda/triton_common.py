"""What the Triton kernels share: interpretation without a GPU (set before triton loads) and
a tile product that the interpreter computes right."""

from __future__ import annotations

import os
from typing import Any

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


class HandleLaunch:
    """A kernel launched eagerly on a step's path, whose host cost counts at batch 1: the first
    launch of each specialization goes through triton's JIT entry (which compiles it), later ones
    through the compiled kernel's handle, without triton's argument binding and cache lookup
    (~16-20 us of an H100 host's time to ~10-12, bench/host_launch_costs.py). Interpreted: always
    the JIT's. `exact`: how many trailing arguments are constexprs, whose values key a
    specialization (the other ints key it as triton does: by being 1, a multiple of 16, past 32
    bits)."""

    def __init__(self, kernel: Any, exact: int = 0, **options: Any) -> None:
        self.kernel, self.exact, self.options = kernel, exact, options
        self.handles: dict[tuple[Any, ...], Any] = {}  # by specialization: a handful at most

    def __call__(self, grid: tuple[int, ...], args: tuple[Any, ...], compiled: bool = True) -> None:
        key = self._key(args) if compiled and not INTERPRETED else None
        k = self.handles.get(key) if key is not None else None
        if k is not None:
            k[(*grid, *(1,) * (3 - len(grid)))](*args)
            return
        k = self.kernel[grid](*args, **self.options)
        if key is not None:
            self.handles[key] = k

    def _key(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """What triton specializes a kernel on, of each argument: a tensor's dtype and 16-byte
        alignment, an int's being 1, a multiple of 16 or past 32 bits, a constexpr's value (and the
        device)."""
        n = len(args) - self.exact
        key: list[Any] = [args[0].device, *args[n:]]
        for a in args[:n]:
            if isinstance(a, torch.Tensor):
                key.append((a.dtype, a.data_ptr() % 16 == 0))
            elif isinstance(a, bool):
                key.append(a)
            else:
                key.append((a == 1, a % 16 == 0, a >= 2**31))
        return tuple(key)
