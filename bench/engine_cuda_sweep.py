"""Bench-local knobs of the GPU decode step, swept through the served engine's loop (async decode
on, bench/engine_cuda.decode_rate), for both shapes in one run:

- the decode backends named by --backends (registry names; bench/engine_cuda_variants.py's too):
  by default the served `cuda` backend, `cuda-fused-rows-0` (never the fused layers: cuBLAS's
  projections with the paged attention kernel at every batch), `cuda-torch-glue` (that cuBLAS
  path as it was before kernels.rope_write: torch's RoPE and KV-write ops) and
  `cuda-attention-by-span` (the attention split by the span alone, as before) at each batch;
  NAME+copied-logits: that backend with the step's logits copied out of the graph's output, as
  before the scheduler took a view of it (graph_runner.GraphRunner.VIEWS off for that view);
- graph parts per decode step (model/graph_runner.GRAPH_PARTS, 1 since 2026-12-06; 4 before, so
  that the GPU started while the host launched the rest), 1 vs 4.

Neither is a field of the served model: each point is a view of the same weights and cache with
a backend or a graph runner of its own.

  python bench/engine_cuda_sweep.py --out $OUT                  # both shapes, one call; each point the median of 3 rounds
  python bench/engine_cuda.py --sweep ...                       # the same beside the main figures
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine_cuda  # noqa: E402
import engine_cuda_variants  # noqa: E402, F401  (registers the variants swept)

from switchyard.engine.model.config import ModelConfig  # noqa: E402
from switchyard.engine.model.decoder import Decoder  # noqa: E402
from switchyard.engine.model.graph_runner import GRAPH_PARTS  # noqa: E402

BACKEND = "sweep: {}"
PARTS = "sweep: graph parts {}"
BACKENDS = "cuda,cuda-fused-rows-0,cuda-torch-glue,cuda-attention-by-span"
COPIED = "+copied-logits"  # a backend's name + this: its view's graph runner copies the logits out (VIEWS off)


def sweep(m: Decoder, c: ModelConfig, batches: list[int], parts_batches: list[int], tokens: int, tok: Any,
          clock: engine_cuda.Clock, add: Any, log: Any, backends: str = BACKENDS, rounds: int = 3) -> None:
    """Rows `sweep: ...` for m's weights: each backend at each batch, then 1 vs 4 graph parts; every
    point `rounds` times, the points of a round in turn, the median kept (one short run a point read
    4x apart between two sweeps on an H200, bench/results/gpu_pdl/call1). Round 0 also captures each
    view's graphs, so the median of three is of the two that follow when they agree."""
    if m.device.type != "cuda":
        log("  sweep: the cuda backends need a GPU; graph parts only")
    points: list[tuple[str, str, dict[str, Any], list[int]]] = []
    if m.device.type == "cuda":
        points += [(BACKEND.format(b), b, {}, batches) for b in backends.split(",") if b]
    points += [(PARTS.format(p), m.backend_name, {"graph_parts": p}, parts_batches) for p in (1, 4)]
    views = {engine: m.view(backend.removesuffix(COPIED), cuda_graphs=True, max_slots=max(bs), **kw)
             for engine, backend, kw, bs in points if bs}
    for engine, backend, _, bs in points:
        if bs and backend.endswith(COPIED) and views[engine].graph_runner is not None:
            views[engine].graph_runner.VIEWS = False  # type: ignore[union-attr]  (this view's runner only)
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    failed: set[str] = set()
    for i in range(rounds):
        for engine, _, _, bs in (pt for pt in points if pt[3]):
            for b in bs:
                if engine in failed or clock.left() < 30:
                    continue
                try:
                    r = engine_cuda.decode_rate(views[engine], b, tokens, c.vocab_size, tok=tok)
                except Exception as e:  # a backend that fails at a batch must not lose the other points
                    log(f"  {engine} b={b}: FAILED {type(e).__name__}: {str(e)[:300]}")
                    failed.add(engine)
                    continue
                runs.setdefault((engine, b), []).append(r)
                log(f"    round {i} {engine} b={b}: step {r['step_ms']:.3f} ms")
    for (engine, b), rs in runs.items():
        steps = [r["step_ms"] for r in rs]
        add(engine, "decode_tok_s", b, statistics.median(r["tok_s"] for r in rs), "tok/s",
            f"step {statistics.median(steps):.3f} ms, median of {len(rs)} rounds "
            f"({', '.join(f'{s:.3f}' for s in steps)})")
    views.clear()
    gc.collect()
    if m.device.type == "cuda":
        torch.cuda.empty_cache()


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """The sweep's rows as two tables: step ms of each backend, and 1 vs 4 graph parts."""
    def ms(shape: str, engine: str, b: int) -> float | None:
        for r in rows:
            if (r["shape"], r["engine"], r["batch"]) == (shape, engine, b) and r["metric"] == "decode_tok_s":
                return float(r["note"].split()[1].rstrip(","))
        return None

    def cell(x: float | None) -> str:
        return "" if x is None else f"{x:.3f}"

    def ratio(x: float | None, y: float | None) -> str:
        return "" if x is None or y is None else f"{x / y:.2f}"

    shapes = list(dict.fromkeys(r["shape"] for r in rows if r["engine"].startswith("sweep:")))
    engines = list(dict.fromkeys(r["engine"] for r in rows
                                 if r["engine"].startswith("sweep:") and not r["engine"].startswith(PARTS.format(""))))
    names = [e.removeprefix("sweep: ") for e in engines]
    out = ["Sweep (async decode on; step ms, lower is better): the decode backends (`cuda`: the served one; "
           "`cuda-fused-rows-N`: the fused Triton layers up to N rows, cuBLAS's projections and the paged attention "
           "kernel past them; `cuda-torch-glue`: that cuBLAS path with torch's RoPE and KV-write ops; "
           "`cuda-attention-by-span`: the attention split by the span alone)", "",
           "| shape | batch | " + " | ".join(f"{n} step ms" for n in names) + " | "
           + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |",
           "| --- | --- |" + " --- |" * (2 * len(names) - 1)]
    for shape in shapes:
        for b in sorted({r["batch"] for r in rows if r["shape"] == shape and r["engine"] in engines}):
            t = [ms(shape, e, b) for e in engines]
            out.append(f"| {shape} | {b} | " + " | ".join(cell(x) for x in t) + " | "
                       + " | ".join(ratio(x, t[0]) for x in t[1:]) + " |")
    out += ["", f"Graph parts per decode step (served: {GRAPH_PARTS}), async decode on:", "",
            "| shape | batch | 1 part step ms | 4 parts step ms | 1 / 4 |", "| --- | --- | --- | --- | --- |"]
    for shape in shapes:
        for b in sorted({r["batch"] for r in rows if r["shape"] == shape and r["engine"] == PARTS.format(1)}):
            one, four = ms(shape, PARTS.format(1), b), ms(shape, PARTS.format(4), b)
            out.append(f"| {shape} | {b} | {cell(one)} | {cell(four)} | {ratio(one, four)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="llama-8b,smollm2-135m")
    ap.add_argument("--batches", default="1,2,4,8,16,32,48,64")
    ap.add_argument("--backends", default=BACKENDS, help="the decode backends swept (registry names)")
    ap.add_argument("--parts-batches", default="1,16")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3, help="each point's runs, the points of a round in turn")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=230)
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args(argv)
    engine_cuda.main(["--shapes", a.shapes, "--batches", "", "--sweep", "--sweep-batches", a.batches,
                      "--parts-batches", a.parts_batches, "--sweep-backends", a.backends, "--tokens", str(a.tokens), "--device", a.device,
                      "--sweep-rounds", str(a.rounds),
                      "--ttft", "", "--peer-batches", "", "--skip-transformers", "--budget-s", str(a.budget_s),
                      "--out", a.out, "--name", "engine_cuda_sweep"])


if __name__ == "__main__":
    main()
