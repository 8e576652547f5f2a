"""What one grid-wide barrier of the persistent decode kernel costs on this GPU
(persistent_kernel.py's _arrive and _wait), alone and with a stage's L2 round trip:

  python bench/grid_barrier.py --programs 132 --barriers 2000

Each program of one launch per multiprocessor passes N barriers; `atomic` polls with acquire atomics
(the kernel's _wait), `load` with acquire loads (ld.acquire.gpu, slower on an H200: 1.35 against 0.93 us);
`data` adds what a stage does around a barrier: every program stores a value and, after the
barrier, loads one another program stored. Prints microseconds a barrier, the median of --rounds."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from persistent_kernel import _arrive, _wait  # noqa: E402


@triton.jit
def _load_wait(bar_ptr, target):
    n = tl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [bar_ptr], dtype=tl.int32,
                                  is_pure=False, pack=1)
    while n < target:
        n = tl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [bar_ptr], dtype=tl.int32,
                                      is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _barriers(bar_ptr, buf_ptr, n, budget, NPROG: tl.constexpr, LOADS: tl.constexpr, DATA: tl.constexpr):
    u = tl.program_id(0)
    acc = 0.0
    spins = budget
    for i in range(n):
        if DATA:
            tl.store(buf_ptr + (i % 2) * NPROG + u, acc + i)
        _arrive(bar_ptr, True)
        if LOADS:
            _load_wait(bar_ptr, (i + 1) * NPROG)
        else:
            spins = _wait(bar_ptr, (i + 1) * NPROG, spins, True)
        if DATA:
            acc += tl.load(buf_ptr + (i % 2) * NPROG + (u + 1) % NPROG, cache_modifier=".cg")
    tl.store(buf_ptr + 2 * NPROG + u, acc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=0, help="0: one per multiprocessor")
    ap.add_argument("--barriers", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warps", type=int, default=8)
    a = ap.parse_args()
    dev = torch.device("cuda")
    progs = a.programs or torch.cuda.get_device_properties(dev).multi_processor_count
    buf = torch.zeros(3 * progs, device=dev)
    print(f"{torch.cuda.get_device_name(dev)}, {progs} programs, {a.warps} warps, {a.barriers} barriers a launch")
    for loads in (False, True):
        for data in (False, True):
            times = []
            for _ in range(a.rounds + 1):
                bar = torch.zeros(3, dtype=torch.int32, device=dev)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                _barriers[(progs,)](bar, buf, a.barriers, 1 << 30, NPROG=progs, LOADS=loads, DATA=data, num_warps=a.warps)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1000 / a.barriers)
            print(f"{'load' if loads else 'atomic':6} polls, {'with' if data else 'without'} a stage's store and "
                  f"load: {statistics.median(times[1:]):.2f} us a barrier (rounds {min(times[1:]):.2f}-"
                  f"{max(times[1:]):.2f})")


if __name__ == "__main__":
    main()
