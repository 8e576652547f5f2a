"""Where a GPU decode step's time goes, before and after the fused decode kernels.

  python bench/engine_cuda_probe.py --out DIR [--shapes smollm2-135m,llama-8b]

Per shape (random bf16 weights, one H200): for each decode variant (the torch backend in 4 graph
parts; the cuda backend, the Triton layer kernels of backends/cuda/kernels.py, in 1, 2 and 4 parts:
views of one decoder, sharing its weights and cache) the step time with the scheduler's host loop
(bench/engine_cuda.decode_rate) at batch 1, 4 and 16, the time of the graphs replayed back to back
(no host work), and the fraction of the bandwidth limit; the cuda backend's logits against the
torch backend's on the same inputs (max |diff| / std); a per-kernel table (torch profiler, graphs
on, 20 batch-1 steps) of each; and the TTFT of 1k and 8k prompts with flash attention and with
cuDNN's attention in prefill (bench/engine_cuda_variants.py's backends).
Writes probe.log and probe.json to DIR.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_cuda_variants  # noqa: E402,F401  (registers the prefill variants)
from engine_cuda import PROMPT, copy_bandwidth, decode_rate, ttft  # noqa: E402

from switchyard.engine.model.decoder import Decoder, weight_bytes_per_token  # noqa: E402
from switchyard.engine.model.random_weights import SHAPES, random_weights  # noqa: E402
from switchyard.engine.model.step import Step
from switchyard.engine.model.weights import Shard  # noqa: E402
from switchyard.engine.runner.comm import SingleRank  # noqa: E402

VARIANTS = (("torch", 4), ("cuda", 1), ("cuda", 2), ("cuda", 4))  # backend, graph parts
MAX_SLOTS = 16


def replay_ms(m: Decoder, n: int = 50) -> float:
    """GPU ms per step, the last captured step's graphs replayed back to back."""
    parts = list(m.graph_runner.graphs.graphs.values())[-1]  # type: ignore[union-attr]
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        for g in parts:
            g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1000


def step_args(batch: int, ctx: int) -> tuple[torch.Tensor, ...]:
    one = torch.ones(batch, dtype=torch.int64)
    return (torch.randint(0, 1000, (batch, 1)), torch.full((batch, 1), ctx - 1), torch.arange(batch), one,
            torch.full((batch,), ctx))


def kernel_table(m: Decoder, steps: int = 20) -> tuple[str, float, float]:
    """(table, kernels per step, GPU kernel ms per step) of batch-1 steps, graphs on."""
    from torch.profiler import ProfilerActivity, profile

    args = step_args(1, PROMPT + 1)
    m.forward(Step(*args, 1))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            m.forward(Step(*args, 1))
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    n = sum(e.count for e in ev) / steps
    us = sum(e.self_device_time_total for e in ev) / steps
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60)
    return table, n, us / 1000


def compare(m: Decoder, batch: int) -> float:
    """Max |cuda - torch| / std(torch) of one decode step's logits on the same cache and inputs."""
    args = step_args(batch, PROMPT + 1)
    out = {name: m.view(name, cuda_graphs=True, max_slots=MAX_SLOTS).forward(Step(*args, batch)).float()
           for name in ("torch", "cuda")}
    return float((out["cuda"] - out["torch"]).abs().max() / out["torch"].std())


def use_tiles(sweep: list[dict[str, Any]]) -> None:
    """Have cuda_kernels.tile_for return the sweep's fastest tile for each shape it measured."""
    from switchyard.engine.backends.cuda import kernels as ck

    best = {(r["kernel"].replace("o_proj", "gemv").replace("down_proj", "gemv"), 1 if r["rows"] == 1 else 16,
             r["n"], r["k"]): ck.Tile(**r["best"]["tile"]) for r in sweep if "best" in r}
    default = ck.tile_for
    ck.tile_for = lambda kind, M_P, n, k, elem=2: best.get((kind, M_P, n, k)) or default(kind, M_P, n, k, elem)


def prefill_table(m: Decoder, n: int, vocab: int) -> tuple[str, float]:
    """(kernel table, GPU ms) of one n-token prefill."""
    from torch.profiler import ProfilerActivity, profile

    ids, lens = torch.randint(0, vocab, (1, n)), torch.tensor([n])
    args = (ids, torch.arange(n).view(1, n), torch.tensor([0]), lens, lens, 0)
    m.forward(Step(*args))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        m.forward(Step(*args))
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    ms = sum(e.self_device_time_total for e in ev) / 1000
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=16, max_name_column_width=70), ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2-135m,llama-8b")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--ttft", default="1024,8192")
    ap.add_argument("--out", default="/tmp")
    ap.add_argument("--tiles", help="sweep.json of bench/cuda_kernels_sweep.py: its best tiles replace tile_for's")
    ap.add_argument("--prefill-profile", type=int, default=8192, help="kernel table of one prefill this long (0: none)")
    a = ap.parse_args()
    if a.tiles:
        use_tiles(json.loads(Path(a.tiles).read_text()))
    dev = torch.device("cuda")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__}

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    bw = copy_bandwidth(dev)
    results["copy_bandwidth_tb_s"] = bw / 1e12
    log(f"{results['device']}, torch {torch.__version__}, copy bandwidth {bw / 1e12:.3f} TB/s")
    for name in a.shapes.split(","):
        c = SHAPES[name]
        w = random_weights(c, seed=0, device=dev, dtype=torch.bfloat16)
        m = Decoder(c, Shard(0, 1, c), w, SingleRank(), max_slots=MAX_SLOTS, max_len=2 * PROMPT, device=dev,
                    backend="cuda")
        del w
        limit = bw / weight_bytes_per_token(m)
        r: dict[str, Any] = {"bandwidth_limit_tok_s": limit, "variants": {}, "kernels": {}}
        results[name] = r
        log(f"\n{name}: {weight_bytes_per_token(m) / 1e9:.3f} GB a batch-1 step, limit {limit:.0f} tok/s")
        t = time.perf_counter()
        m.warmup()
        st = m.status()
        log(f"  warm-up {time.perf_counter() - t:.1f}s, {st['decode_kernels']} {st.get('decode_kernels_reason', '')}")
        for b in (1, 4):
            r[f"fused_vs_torch_b{b}"] = compare(m, b)
            log(f"  fused vs torch logits, batch {b}: max |diff| = {r[f'fused_vs_torch_b{b}']:.4f} x std")
        for impl, parts in VARIANTS:
            v = m.view(impl, cuda_graphs=True, max_slots=MAX_SLOTS, graph_parts=parts)
            for b in (int(x) for x in a.batches.split(",")):
                v.graph_runner.graphs.clear()  # type: ignore[union-attr]
                d = decode_rate(v, b, 48, c.vocab_size)
                rep = replay_ms(v)
                key = f"{impl}-parts{parts}-b{b}"
                r["variants"][key] = {**d, "replay_ms": rep}
                frac = f", {d['tok_s'] / limit:.0%} of the limit" if b == 1 else ""
                log(f"  {impl:5} parts={parts} b={b:<2} step {d['step_ms']:.3f} ms ({d['tok_s']:,.0f} tok/s{frac}), "
                    f"replay alone {rep:.3f} ms")
        for impl, parts in (("torch", 4), ("cuda", 1)):
            table, n, ms = kernel_table(m.view(impl, cuda_graphs=True, max_slots=MAX_SLOTS, graph_parts=parts))
            r["kernels"][impl] = {"per_step": n, "gpu_ms_per_step": ms}
            log(f"\n  {impl} step kernels: {n:.0f} a step, {ms:.3f} ms of GPU time a step\n{table}")
        lens = [int(x) for x in a.ttft.split(",") if x]
        if lens:
            m.allocate_cache(1, max(lens) + 16)
            for backend in ("flash", "cudnn"):
                v = m.view(f"cuda-prefill-{backend}")
                try:
                    ttft(v, min(lens), c.vocab_size, reps=1)
                    for n in lens:
                        r[f"ttft_{backend}_{n}"] = ttft(v, n, c.vocab_size)
                        log(f"  TTFT {n} tokens, {backend}: {r[f'ttft_{backend}_{n}']:.1f} ms")
                except Exception as e:  # a backend refusing the shapes must not lose the rest
                    log(f"  TTFT {backend}: FAILED {type(e).__name__}: {e}")
            if a.prefill_profile and a.prefill_profile <= max(lens):
                table, ms = prefill_table(m.view("cuda-prefill-cudnn"), a.prefill_profile, c.vocab_size)
                r["prefill_gpu_ms"] = ms
                log(f"\n  prefill {a.prefill_profile} tokens (cudnn): {ms:.1f} ms of GPU kernels\n{table}")
        del m
        torch.cuda.empty_cache()
        (out / "probe.json").write_text(json.dumps(results, indent=1))
    (out / "probe.log").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
