"""What a hand-over between two Python threads costs on this host: the GPU replica's grammar fill is one.

The engine's thread wakes the masker's fill thread (chat/grammar.GrammarMasker, filled ahead) and goes on
with its own Python work, part of it in calls that drop the GIL (a kernel's launch, a graph's replay). This
times, with the fill thread's stand-in (it wakes from a queue, runs a few Python lines, then a call that drops
the GIL for `--fill-us`, as llguidance's fill does):

- wake: from the put to the fill thread running Python (the fill's late start);
- the engine's `--work-us` of Python after the put, alone, with a GIL-dropping call first (`release`), or
  without one: what the engine's thread loses when the fill thread takes the GIL it dropped and it has to
  be woken to get it back.

  python bench/gil_handoff.py              # switch intervals 100 us (the masker's) and 5 ms (Python's)

Medians and p90 of --reps hand-overs, us.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time


def spin(us: float) -> None:
    """Python work for `us` microseconds (holds the GIL)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < us * 1e-6:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--work-us", type=float, default=30, help="the engine's Python work after the put")
    ap.add_argument("--fill-us", type=float, default=300, help="the fill's GIL-free time")
    ap.add_argument("--intervals-us", default="100,5000", help="GIL switch intervals")
    a = ap.parse_args()
    jobs: queue.SimpleQueue[float] = queue.SimpleQueue()
    woke: list[float] = []

    def fill() -> None:
        while True:
            put_at = jobs.get()
            woke.append(time.perf_counter() - put_at)
            time.sleep(a.fill_us * 1e-6)  # drops the GIL, as llguidance's fill does

    threading.Thread(target=fill, daemon=True).start()
    print(f"Python {sys.version.split()[0]}; us, median (p90) of {a.reps}")
    for interval in (float(x) for x in a.intervals_us.split(",")):
        sys.setswitchinterval(interval * 1e-6)
        for release in (False, True):
            took: list[float] = []
            woke.clear()
            for _ in range(a.reps):
                time.sleep(0.001 + a.fill_us * 1e-6)  # the last fill has ended
                t0 = time.perf_counter()
                jobs.put(t0)
                if release:
                    time.sleep(0)  # a call that drops the GIL and returns at once
                spin(a.work_us)
                took.append((time.perf_counter() - t0) * 1e6)

            def q(v: list[float], scale: float = 1.0) -> str:
                v = sorted(x * scale for x in v)
                return f"{statistics.median(v):6.0f} ({v[int(0.9 * (len(v) - 1))]:.0f})"
            print(f"  switch {interval:5.0f} us, {'a GIL drop first' if release else 'no GIL drop    '}: the engine's "
                  f"{a.work_us:.0f} us of work took {q(took)}; the fill thread woke after {q(woke, 1e6)}")


if __name__ == "__main__":
    main()
