"""A GPU replica's host threads on cores of their own (--pin-cpus on; off by default).

At SmolLM2's batch 1 a decode step is ~0.4 ms of GPU work, and the engine's loop thread must launch the next
one in that time; a thread the kernel moves between cores, or that shares a core with the grammar fill
process's spin, misses it. So the loop thread takes the first core it may run on (its hyperthreads left idle)
and the fill process one hyperthread of each other core (bench/results/gpu_fill_lanes, call 20: on a noisy
H100 host the batch-1 rate under a grammar rose from 1,548-1,876 to 2,017-2,376 tok/s). The layout is taken
within the CPUs the process may use, so replicas sharing a host need CPUs of their own first (taskset, a
container's cpuset); unasked, each would take the same first core.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


def cpu_siblings(cpu: int) -> set[int]:
    """The CPUs sharing cpu's core (its hyperthreads), from sysfs; {cpu} where it does not say."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            text = f.read().strip()
    except OSError:
        return {cpu}
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out or {cpu}


@dataclass(frozen=True)
class Layout:
    engine: int  # the loop thread's CPU
    fill: list[int]  # the grammar fill process's CPUs


def pinned_layout(cpus: set[int], siblings: Callable[[int], set[int]] = cpu_siblings) -> Layout | None:
    """The loop thread on the first core of `cpus`, the fill process on one hyperthread of each other core;
    None where fewer than three cores are at hand (two cores: one spinning side would starve the other)."""
    cores: list[int] = []  # the first CPU of each core, in order
    seen: set[int] = set()
    for c in sorted(cpus):
        if c not in seen:
            seen |= siblings(c)
            cores.append(c)
    return Layout(cores[0], cores[1:]) if len(cores) >= 3 else None


def pin_this_thread() -> tuple[Layout, set[int]] | None:
    """Pins the calling thread (Linux: pid 0 is the calling thread alone) as pinned_layout says; returns the
    layout and the thread's CPUs before (for unpin), or None where there is no layout to take."""
    before = os.sched_getaffinity(0)
    layout = pinned_layout(before)
    if layout is None:
        return None
    os.sched_setaffinity(0, {layout.engine})
    return layout, before


def unpin_this_thread(before: set[int]) -> None:
    os.sched_setaffinity(0, before)
