"""Where a GPU decode step's time goes: step-time of decode variants (KV write, attention
kernel, fused ops on/off) at batch 1 and 64, graph-replay-only time (no host work), and a
profile of the kernels in one eager step.

  python bench/engine_cuda_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_cuda import PROMPT, decode_rate  # noqa: E402

from switchyard.engine.comm import SingleRank  # noqa: E402
from switchyard.engine.cuda_model import CudaModel  # noqa: E402
from switchyard.engine.cuda_ops import Ops  # noqa: E402
from switchyard.engine.random_weights import SHAPES, random_weights  # noqa: E402
from switchyard.engine.weights import Shard  # noqa: E402


def replay_ms(m: CudaModel, n: int = 50) -> tuple[float, float]:
    """(GPU ms per step replaying back to back, host ms to launch one step's graphs)."""
    parts = next(iter(m.graphs.graphs.values()))
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        for g in parts:
            g.replay()
    torch.cuda.synchronize()
    gpu = (time.perf_counter() - t) / n * 1000
    launch = []
    for _ in range(10):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for g in parts:
            g.replay()
        launch.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return gpu, sorted(launch)[5] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2-135m,llama-8b")
    ap.add_argument("--out", default="/tmp")
    a = ap.parse_args()
    dev = torch.device("cuda")
    lines = []

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    for name in a.shapes.split(","):
        c = SHAPES[name]
        w = random_weights(c, seed=0, device=dev, dtype=torch.bfloat16)
        m = CudaModel(c, Shard(0, 1, c), w, SingleRank(), max_slots=64, max_len=2 * PROMPT, device=dev)
        del w
        compiled_ops = m.ops
        for kv, attn, comp, parts in (("scatter", "sdpa", True, 1), ("scatter", "bmm", True, 1),
                                      ("scatter", "bmm", True, 2), ("scatter", "bmm", True, 4),
                                      ("scatter", "bmm", True, 8), ("scatter", "bmm", False, 4)):
            m.kv_write, m.attn_impl, m.graph_parts = kv, attn, parts
            m.ops = compiled_ops if comp else Ops(dev, compile_ops=False)
            m.graphs.clear()
            for b in (1, 64):
                r = decode_rate(m, b, 32, c.vocab_size)
                rep, launch = replay_ms(m)
                m.graphs.clear()
                log(f"{name:13} kv={kv:8} attn={attn:5} compiled={comp!s:5} parts={parts} b={b:<3} "
                    f"step {r['step_ms']:.3f} ms ({r['tok_s']:.0f} tok/s), replay alone {rep:.3f} ms, "
                    f"launch {launch:.3f} ms")
        m.kv_write, m.attn_impl, m.ops, m.graph_parts = "scatter", "bmm", compiled_ops, 1
        decode_rate(m, 1, 4, c.vocab_size)
        m.graphs.enabled = False
        from torch.profiler import ProfilerActivity, profile

        one = torch.ones(1, dtype=torch.int64)
        args = (torch.tensor([[1]]), torch.tensor([[PROMPT]]), torch.tensor([0]), one, torch.tensor([PROMPT + 1]), 1)
        m.forward(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                m.forward(*args)
            torch.cuda.synchronize()
        log(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=22, max_name_column_width=70))
        del m
        torch.cuda.empty_cache()
    Path(a.out, "probe.log").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
