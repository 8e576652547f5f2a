"""The GPU's clocks while a block of work runs: nvidia-smi sampling the SM clock, power, temperature and
the clock-event reasons every 50 ms (bench/engine_cuda_profile.py's prefill alternation). Whether a
kernel's rate inside a long run is below its rate alone because the clocks drop under sustained load.

  with ClockWatch(gpu=True) as clocks:
      work()
  print(clocks.summary())
"""

from __future__ import annotations

import collections
import shutil
import statistics
import subprocess
import tempfile


class ClockWatch:
    """nvidia-smi sampling the GPU's SM clock, power and clock-event reasons every 50 ms while the
    block runs (the GPU's own, not the process's): whether a kernel's rate inside a long prefill is
    below its rate alone because the clocks drop under sustained load."""

    FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"

    def __init__(self, gpu: bool) -> None:
        self.gpu, self.proc, self.rows = gpu, None, []  # type: ignore[var-annotated]

    def __enter__(self) -> ClockWatch:
        if self.gpu and shutil.which("nvidia-smi"):
            self.file = tempfile.TemporaryFile(mode="w+")
            self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits",
                                          "-lms", "50"], stdout=self.file, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
            self.file.seek(0)
            for line in self.file:
                parts = [x.strip() for x in line.split(",")]
                try:
                    self.rows.append((float(parts[0]), float(parts[1]), float(parts[2]), parts[3]))
                except (ValueError, IndexError):  # a field this driver does not know
                    continue

    def summary(self) -> str:
        if not self.rows:
            return "GPU clocks: not sampled (no nvidia-smi, or it refused the fields)"
        sm, watts, temp = ([r[i] for r in self.rows] for i in range(3))
        reasons = collections.Counter(r[3] for r in self.rows)
        return (f"GPU clocks over the alternated rounds ({len(self.rows)} samples, 50 ms apart): SM "
                f"{min(sm):.0f} / {statistics.median(sm):.0f} / {max(sm):.0f} MHz (min / median / max), power up to "
                f"{max(watts):.0f} W, up to {max(temp):.0f} C; clock-event reasons (nvidia-smi bitmask: samples) "
                + ", ".join(f"{k}: {v}" for k, v in reasons.most_common(5)))
