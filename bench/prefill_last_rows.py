"""A prefill's time with its last layer on each prompt's last row (the decoder's default, `last_rows`)
against every row, alternated, on this machine's CPU (or GPU), random weights of a model's shape.

  python bench/prefill_last_rows.py [--shape smollm2-135m] [--dtype int4] [--backend cpu] [--tokens 512] [--rounds 15]

Prints each variant's median, min and max in ms. The GPU's figure for the 8B shape's 8k prompt comes
from `bench/engine_cuda_profile.py --prefill 8192`, which alternates the same two.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from switchyard.engine.backends.cpu.native import keep_workers_spinning

keep_workers_spinning()  # as `engine serve` does, before torch loads libgomp

import torch  # noqa: E402

from switchyard.engine.model.decoder import Decoder  # noqa: E402
from switchyard.engine.model.random_weights import SHAPES, random_weights  # noqa: E402
from switchyard.engine.model.step import Step  # noqa: E402
from switchyard.engine.model.weights import Shard  # noqa: E402
from switchyard.engine.runner.comm import SingleRank  # noqa: E402

EVERY_ROW: dict[str, Any] = {"last_rows": lambda *_: None}  # the backend's last_rows declining every step


def backend_ab(backend: Any, run: Callable[[], float], rounds: int, variants: dict[str, dict[str, Any]],
               settle_s: float = 0.0) -> dict[str, list[float]]:
    """run() (a prefill's ms) under each variant (the backend's attributes it sets, on the instance),
    alternated `rounds` times, each after `settle_s` idle (a GPU's clocks back from the run before's
    load); the backend is left as it was."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for _ in range(rounds):
            for k, ts in times.items():
                for name, value in variants[k].items():
                    setattr(backend, name, value)
                time.sleep(settle_s)
                ts.append(run())
                for name in variants[k]:
                    delattr(backend, name)  # back to the class's
    finally:
        for v in variants.values():
            for name in v:
                backend.__dict__.pop(name, None)
    return times


def last_rows_ab(m: Decoder, run: Callable[[], float], rounds: int) -> dict[str, list[float]]:
    """run() with the last layer on last rows and on every row, alternated `rounds` times."""
    return backend_ab(m.backend, run, rounds, {"last rows": {}, "every row": EVERY_ROW})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="int4")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    c = SHAPES[a.shape]
    m = Decoder(c, Shard(0, 1, c), random_weights(c, seed=1), SingleRank(), max_slots=1, max_len=a.tokens + 16,
                dtype=a.dtype, backend=a.backend, device=a.device)
    n = a.tokens
    lens = torch.tensor([n])
    step = Step(torch.randint(0, c.vocab_size, (1, n)), torch.arange(n).view(1, n), torch.tensor([0]), lens, lens)
    def run() -> float:
        t0 = time.perf_counter()
        int(m.forward(step).argmax())
        return (time.perf_counter() - t0) * 1000

    run()  # warm
    times = last_rows_ab(m, run, a.rounds)
    print(f"{a.shape} {a.dtype} on {m.backend_name} ({a.device}), a {n}-token prefill, {a.rounds} alternated rounds, "
          f"{torch.get_num_threads()} threads:")
    for k, ts in times.items():
        print(f"  {k:9}  median {statistics.median(ts):8.1f} ms  (min {min(ts):.1f}, max {max(ts):.1f})")


if __name__ == "__main__":
    main()
