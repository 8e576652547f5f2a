"""Bench-local knobs of the GPU decode step, swept through the served engine's loop (async decode
on, bench/engine_cuda.decode_rate), for both shapes in one run:

- the cuda backend's fused-rows threshold (backends/cuda/backend.MAX_FUSED_ROWS = 16: steps of up
  to 16 rows run the fused Triton layers, larger ones cuBLAS's projections): fused vs not at each
  batch (bench/engine_cuda_variants.py's `cuda-fused-rows-N` backends, N = 16 and 0);
- graph parts per decode step (model/graph_runner.GRAPH_PARTS = 4: the step captured as 4 graphs
  so that the GPU starts while the host launches the rest), 1 vs 4.

Neither is a field of the served model: each point is a view of the same weights and cache with
a backend or a graph runner of its own.

  python bench/engine_cuda_sweep.py --out $OUT                  # both shapes, one call
  python bench/engine_cuda.py --sweep ...                       # the same beside the main figures
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine_cuda  # noqa: E402
import engine_cuda_variants  # noqa: E402, F401  (registers cuda-fused-rows-N)

from switchyard.engine.model.config import ModelConfig  # noqa: E402
from switchyard.engine.model.decoder import Decoder  # noqa: E402

FUSED = "sweep: fused rows <= {}"
PARTS = "sweep: graph parts {}"


def sweep(m: Decoder, c: ModelConfig, batches: list[int], parts_batches: list[int], tokens: int, tok: Any,
          clock: engine_cuda.Clock, add: Any, log: Any) -> None:
    """Rows `sweep: ...` for m's weights: fused vs not at each batch, then 1 vs 4 graph parts."""
    if m.device.type != "cuda":
        log("  sweep: the fused rows need the cuda backend on a GPU; graph parts only")
    points: list[tuple[str, str, dict[str, Any], list[int]]] = []
    if m.device.type == "cuda":
        points += [(FUSED.format(k), f"cuda-fused-rows-{k}", {}, batches) for k in (16, 0)]
    points += [(PARTS.format(p), m.backend_name, {"graph_parts": p}, parts_batches) for p in (1, 4)]
    for engine, backend, kw, bs in points:
        v = m.view(backend, cuda_graphs=True, max_slots=max(bs), **kw)
        for b in bs:
            if clock.left() < 30:
                log(f"  {engine} b={b}: skipped (time)")
                break
            t = time.perf_counter()
            r = engine_cuda.decode_rate(v, b, tokens, c.vocab_size, tok=tok)
            add(engine, "decode_tok_s", b, r["tok_s"], "tok/s",
                f"step {r['step_ms']:.3f} ms, point {time.perf_counter() - t:.1f} s")
        del v
        gc.collect()
        if m.device.type == "cuda":
            torch.cuda.empty_cache()


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """The sweep's rows as two tables: step ms fused vs not, and 1 vs 4 graph parts."""
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
    out = ["Sweep (async decode on; step ms, lower is better): the fused Triton layers vs cuBLAS's projections "
           "and the paged attention kernel (the served threshold: fused up to 16 rows)", "",
           "| shape | batch | fused step ms | not fused step ms | fused / not |", "| --- | --- | --- | --- | --- |"]
    for shape in shapes:
        for b in sorted({r["batch"] for r in rows if r["shape"] == shape and r["engine"] == FUSED.format(16)}):
            f, u = ms(shape, FUSED.format(16), b), ms(shape, FUSED.format(0), b)
            out.append(f"| {shape} | {b} | {cell(f)} | {cell(u)} | {ratio(f, u)} |")
    out += ["", "Graph parts per decode step (served: 4), async decode on:", "",
            "| shape | batch | 1 part step ms | 4 parts step ms | 1 / 4 |", "| --- | --- | --- | --- | --- |"]
    for shape in shapes:
        for b in sorted({r["batch"] for r in rows if r["shape"] == shape and r["engine"] == PARTS.format(1)}):
            one, four = ms(shape, PARTS.format(1), b), ms(shape, PARTS.format(4), b)
            out.append(f"| {shape} | {b} | {cell(one)} | {cell(four)} | {ratio(one, four)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="llama-8b,smollm2-135m")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--parts-batches", default="1,16")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=230)
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args(argv)
    engine_cuda.main(["--shapes", a.shapes, "--batches", "", "--sweep", "--sweep-batches", a.batches,
                      "--parts-batches", a.parts_batches, "--tokens", str(a.tokens), "--device", a.device,
                      "--ttft", "", "--peer-batches", "", "--skip-transformers", "--budget-s", str(a.budget_s),
                      "--out", a.out, "--name", "engine_cuda_sweep"])


if __name__ == "__main__":
    main()
