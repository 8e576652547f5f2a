"""Where the persistent one-row decode kernel's time goes (persistent_kernel.py): one GPU,
SmolLM2's shape with random bf16 weights, a one-row step after a --prompt-token context, and
program 0's clock as it leaves each stage (its spin for the stage before plus its own work):

  python bench/persistent_stages.py --prompt 128 --runs 20

Prints each stage's median over layers and runs (us), the launch's time from its events, and
the five stages' sum a layer. The kernel compiled with TIMED stores one clock a stage; its
untimed time is printed beside it, so the stamps' own cost shows."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import engine_cuda_variants  # noqa: E402, F401  (registers cuda-persistent)
import persistent_kernel as persistent  # noqa: E402

from switchyard.engine.model.common import embed_tokens  # noqa: E402
from switchyard.engine.model.decoder import Decoder  # noqa: E402
from switchyard.engine.model.random_weights import SHAPES, random_weights  # noqa: E402
from switchyard.engine.model.step import Step  # noqa: E402
from switchyard.engine.model.weights import Shard  # noqa: E402
from switchyard.engine.runner.comm import SingleRank  # noqa: E402

STAGES = ("QKV+RoPE+KV", "attention", "o-proj", "gate/up", "down")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tile", type=int, default=persistent.TILE)
    a = ap.parse_args()
    dev = torch.device("cuda")
    c = SHAPES[a.shape]
    m = Decoder(c, Shard(0, 1, c), random_weights(c, seed=0, device=dev, dtype=torch.bfloat16), SingleRank(),
                max_slots=1, max_len=a.prompt + 64, device=dev, dtype=torch.bfloat16, backend="cuda-persistent",
                cuda_graphs=False)
    be, d = m.backend, m.dims
    n, one = a.prompt, torch.ones(1, dtype=torch.int64)
    m.forward(Step(torch.arange(n).view(1, n) % 100, torch.arange(n).view(1, n), torch.zeros_like(one), one * n,
                   one * n))
    span = -(-(n + 1) // 256) * 256
    ids, pos, ctx = (torch.tensor([v], device=dev) for v in (7, n, n + 1))
    tables = m.slot_tables(torch.tensor([0]))[:, : span // d.block_size].contiguous().to(dev)
    p = be.decode_plan(ids, pos, ctx, tables, span, False)
    shape = persistent.Shape.of(d, m.layers, persistent.programs_for(dev), tile=a.tile)
    x0 = embed_tokens(ids, m.embed, m.shard, m.comm)
    L = len(m.layers)
    times = torch.zeros(L * 5 + 1, dtype=torch.int64, device=dev)

    def run(timed: bool) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        x = x0.clone()
        start.record()
        persistent.run_layers(x, m.layers, be.offsets, m.k_cache, m.v_cache, d, p.pos, p.w_blocks, p.w_offs, p.tables,
                              p.ctx, span, be.barrier, shape, grid_sync=True, times=times if timed else None)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000

    for timed in (False, True):
        run(timed)  # compiles
    per: list[list[float]] = [[] for _ in STAGES]
    launch, untimed = [], []
    for _ in range(a.runs):
        untimed.append(run(False))
        launch.append(run(True))
        t = times.tolist()
        prev = t[L * 5]
        for li in range(L):
            for k in range(5):
                per[k].append((t[li * 5 + k] - prev) / 1000)
                prev = t[li * 5 + k]
    assert be.barrier.tolist() == [0, 0, 0], be.barrier.tolist()
    print(f"{torch.cuda.get_device_name(dev)}: {a.shape}, one row at context {n + 1} (span {span}), {shape}")
    print(f"launch {statistics.median(launch):.1f} us timed, {statistics.median(untimed):.1f} us untimed "
          f"(event medians of {a.runs}); {L} layers")
    print("| stage | median us | p10 | p90 |\n| --- | --- | --- | --- |")
    for name, ts in zip(STAGES, per, strict=True):
        q = statistics.quantiles(ts, n=10)
        print(f"| {name} | {statistics.median(ts):.2f} | {q[0]:.2f} | {q[-1]:.2f} |")
    print(f"| a layer (sum of medians) | {sum(statistics.median(ts) for ts in per):.2f} | | |")


if __name__ == "__main__":
    main()
