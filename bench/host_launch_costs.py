"""The host's cost of each launch in a decode step's sampling stage, one at a time, on a GPU.

At SmolLM2's batch 1 the host's turn is the step's pace (bench/results/gpu_grammar_host: the turn
~0.6-0.8 ms against a GPU step of ~0.5 ms), and under a grammar the masks' upload and kernel
launch took 0.085-0.11 ms of it. This times, per call on the host (the GPU kept ahead of nothing:
a sync every 32 calls), each piece and its cheaper forms:

  python bench/host_launch_costs.py --batches 1,16 --calls 2000

- mask upload: the masks' pinned rows to the device (transfer.upload, as the masker does);
- mask kernel, JIT launch: backends/cuda/token_mask's kernel through triton's JIT entry;
- mask kernel, compiled launch: the same compiled kernel launched through its handle;
- mask kernel, pinned masks read in place: no upload, the kernel reads the pinned rows (UVA);
- mask, whole: apply_token_bitmask_cuda as served; mask, torch ops: the torch path;
- argmax: the greedy sampler's choice (sampling.sample_tokens);
- download: transfer.Download of the tokens from a DownloadPool (served), with a new pinned tensor
  and event each (served before 2026-12-06), and a bare reused buffer and event (the floor);
- event: torch.cuda.Event() and its record alone;
- inputs up: a step's staged inputs to the device, as a strided [4, S] view of a pinned [4, 64]
  buffer (the graph runner before 2026-12-06: torch copies it through a pageable temporary and a
  copy kernel) and as one contiguous run (now);
- graph runner: model/graph_runner.GraphRunner.run of a step whose graph is one small kernel (the
  inputs staged and copied up, the device ids copied in, the graph replayed, the logits gathered).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def per_call(fn: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """Median over rounds of the host's microseconds a call."""
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = 0.0
        for i in range(calls):
            t0 = time.perf_counter()
            fn()
            t += time.perf_counter() - t0
            if i % 32 == 31:
                torch.cuda.synchronize()
        out.append(t / calls * 1e6)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}; host us a call (median of 5 rounds of {a.calls})")
    for B in (int(b) for b in a.batches.split(",")):
        bench_batch(B, a.vocab, a.calls)


def bench_batch(B: int, V: int, calls: int) -> None:
    """Each case's host cost at batch B over a vocabulary of V."""
    from switchyard.engine.backends.cpu.token_mask import apply_token_bitmask_torch
    from switchyard.engine.backends.cuda import token_mask as tm
    from switchyard.engine.backends.transfer import Download, DownloadPool, upload
    from switchyard.engine.core.sampling import SamplingParams, sample_tokens

    dev = torch.device("cuda")
    W = (V + 31) // 32
    g = torch.Generator().manual_seed(B)
    bm_host = torch.randint(-2**31, 2**31 - 1, (B, W), generator=g, dtype=torch.int64).to(torch.int32).pin_memory()
    logits = torch.randn(B, V, device=dev, dtype=torch.float32)
    bm_dev = upload(bm_host, torch.int32, dev)
    grid = (B, tm.triton.cdiv(V, tm.BLOCK))
    args = (logits, logits.stride(0), bm_dev, W, bm_dev, V)
    compiled = tm._bitmask_kernel[grid](*args, BLOCK=tm.BLOCK, ROWS=False)
    fast = compiled[(grid[0], grid[1], 1)]
    # in place from pinned memory: the same masks as from the device copy?
    x, y = logits.clone(), logits.clone()
    tm._bitmask_kernel[grid](x, x.stride(0), bm_dev, W, bm_dev, V, BLOCK=tm.BLOCK, ROWS=False)
    try:
        tm._bitmask_kernel[grid](y, y.stride(0), bm_host, W, bm_host, V, BLOCK=tm.BLOCK, ROWS=False)
        torch.cuda.synchronize()
        in_place = bool(torch.equal(x, y))
    except Exception as e:  # triton may refuse a host pointer
        in_place = False
        print(f"  b={B} pinned masks read in place: refused ({type(e).__name__}: {str(e)[:120]})")
    params = [SamplingParams(temperature=0.0)] * B
    tokens = sample_tokens(logits, params, [None] * B)
    buf = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    ev = torch.cuda.Event()
    pool = DownloadPool()

    def reused() -> None:
        buf.copy_(tokens, non_blocking=True)
        ev.record()

    cases: dict[str, Callable[[], object]] = {
        "mask upload": lambda: upload(bm_host, torch.int32, dev),
        "mask kernel, JIT launch": lambda: tm._bitmask_kernel[grid](*args, BLOCK=tm.BLOCK, ROWS=False),
        "mask kernel, compiled launch": lambda: fast(*args, tm.BLOCK, False),
        "mask, whole (served)": lambda: tm.apply_token_bitmask_cuda(logits, bm_host, list(range(B))),
        "mask, torch ops": lambda: apply_token_bitmask_torch(logits, bm_host, list(range(B))),
        "argmax (sample_tokens)": lambda: sample_tokens(logits, params, [None] * B),
        "download, a DownloadPool's (served)": lambda: Download([tokens], pool),
        "download, new pinned tensor and event": lambda: Download([tokens]),
        "download, bare reused buffer and event": reused,
        "event: new + record": lambda: torch.cuda.Event().record(),
    }
    cases.update(staging_cases(B, V, tokens))
    if in_place:
        cases["mask kernel, pinned read in place, JIT"] = lambda: tm._bitmask_kernel[grid](
            logits, logits.stride(0), bm_host, W, bm_host, V, BLOCK=tm.BLOCK, ROWS=False)
    for name, fn in cases.items():
        print(f"  b={B:<3d} {name:40s} {per_call(fn, calls):8.1f} us", flush=True)
    print(f"  b={B} pinned masks read in place equal the device copy's: {in_place}")


def staging_cases(B: int, V: int, tokens: torch.Tensor) -> dict[str, Callable[[], object]]:
    """A decode step's input staging on the host, and the graph runner's whole launch."""
    from types import SimpleNamespace

    from switchyard.engine.model.graph_runner import GraphRunner
    from switchyard.engine.model.step import Step
    from switchyard.engine.runner.comm import SingleRank

    dev = torch.device("cuda")
    slots, span = 64, 512
    strided_host = torch.zeros(4, slots, dtype=torch.int64, pin_memory=True)
    strided_dev = torch.zeros(4, slots, dtype=torch.int64, device=dev)
    flat_host = torch.zeros((4 + span // 16) * slots, dtype=torch.int64, pin_memory=True)
    flat_dev = torch.zeros_like(flat_host, device=dev)
    n = (4 + span // 16) * B
    dims = SimpleNamespace(device=dev, block_size=16, max_len=span, num_blocks=1000, comm=SingleRank(), hidden=576)

    def decode(ids: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor, tables: torch.Tensor, span: int, graphs: bool,
               per: int, out: torch.Tensor) -> Any:
        if False:
            yield
        return (pos + ctx + tables[:, 0] + ids).float()[:, None].expand(-1, V)

    runner = GraphRunner(dims, decode, slots, V, 1, True)  # type: ignore[arg-type]
    ctx = torch.full((B,), 100, dtype=torch.int64)
    step = Step.of(tokens.view(B, 1), (ctx - 1).view(B, 1), torch.arange(B), torch.ones(B, dtype=torch.int64), ctx,
                   B, torch.arange(B * 8, dtype=torch.int64).view(B, 8))
    runner.run(step)  # captures its graph
    return {
        f"inputs up, strided [4, {B}] view (before)": lambda: strided_dev[:, :B].copy_(strided_host[:, :B],
                                                                                          non_blocking=True),
        f"inputs up, contiguous {n} entries": lambda: flat_dev[:n].copy_(flat_host[:n], non_blocking=True),
        "graph runner: stage, copy, replay, gather": lambda: runner.run(step),
    }


if __name__ == "__main__":
    main()
