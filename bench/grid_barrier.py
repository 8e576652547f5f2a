"""What one grid-wide barrier of the persistent decode kernel costs on this GPU
(backends/cuda/persistent.py's _arrive and _wait), alone and with a stage's L2 round trip:

  python bench/grid_barrier.py --programs 132 --barriers 2000

Each program of one launch per multiprocessor passes N barriers; `poll` spins with plain volatile
loads then acquires once (the kernel's), `atomic` polls with acquire atomics (its first version);
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
from switchyard.engine.backends.cuda.persistent import _arrive, _wait  # noqa: E402


@triton.jit
def _atomic_wait(bar_ptr, target):
    n = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    while n < target:
        n = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _barriers(bar_ptr, buf_ptr, n, NPROG: tl.constexpr, ATOMIC: tl.constexpr, DATA: tl.constexpr):
    u = tl.program_id(0)
    acc = 0.0
    for i in range(n):
        if DATA:
            tl.store(buf_ptr + (i % 2) * NPROG + u, acc + i)
        _arrive(bar_ptr, True)
        if ATOMIC:
            _atomic_wait(bar_ptr, (i + 1) * NPROG)
        else:
            _wait(bar_ptr, (i + 1) * NPROG, 1 << 30, True)
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
    for atomic in (False, True):
        for data in (False, True):
            times = []
            for _ in range(a.rounds + 1):
                bar = torch.zeros(3, dtype=torch.int32, device=dev)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                _barriers[(progs,)](bar, buf, a.barriers, NPROG=progs, ATOMIC=atomic, DATA=data, num_warps=a.warps)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1000 / a.barriers)
            print(f"{'atomic' if atomic else 'poll':6} polls, {'with' if data else 'without'} a stage's store and "
                  f"load: {statistics.median(times[1:]):.2f} us a barrier (rounds {min(times[1:]):.2f}-"
                  f"{max(times[1:]):.2f})")


if __name__ == "__main__":
    main()
