"""One decode run of the served loop (bench/engine_cuda.py's decode_rate), long enough to profile
the host's share of a step, free or under a grammar; run it under py-spy:

  py-spy record -r 1000 -f raw -o grammar.txt -- python bench/engine_cuda_profile.py --grammar
  python bench/engine_cuda_profile.py --shape smollm2-135m --batch 1 --tokens 3000   # free

Prints the decode rate; random bf16 weights of the shape, CUDA graphs, async decode. --sync-debug
turns on torch's CUDA sync debug mode for the measured run and prints where the host waited for
the device (each distinct Python stack, with its count): under async decode only the tokens' read
(Download.get) should appear.

--host-split times the parts of the host's turn a step (each wrapped in a timer: the step's launch,
the wait for the step in flight's tokens, the output stage's host share, llguidance's accepts and fill,
the masks' upload and kernel launch, the sampling's launches), means over the measured steps;
--grammar tools uses the tool-call grammar (plain strings) instead of the JSON one:

  python bench/engine_cuda_profile.py --batch 1 --tokens 1000 --grammar items --host-split

--kernels N profiles N steady decode steps of the served loop (and, as the backend `peer`, of the
compiled PyTorch peer's loop) with torch's profiler (CUDA
activity only, so that the host runs as it does unprofiled) for each backend of --backends (the
same weights and cache, each with its own graphs): the GPU's time a step (first kernel to last),
its busy time (the union of its kernels and copies) and idle time, and the kernels by total time
a step, written to --out as kernels_<shape>_b<batch>.md:

  python bench/engine_cuda_profile.py --shape llama-8b --batch 64 --kernels 24 \\
      --backends cuda,cuda-torch-glue --out $OUT

A backend's name may say more: `+torch-argmax` samples its greedy rows with torch's argmax rather
than the output stage's GPU kernel (head_kernels.RowArgmax), `@N` captures its decode step in N
graphs (graph_runner.GRAPH_PARTS otherwise): `cuda+torch-argmax`, `cuda@1`.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_cuda as ec  # noqa: E402
import engine_cuda_variants  # noqa: E402, F401  (registers the benches' backends for --backends)
from gpu_clocks import ClockWatch  # noqa: E402
from prefill_last_rows import EVERY_ROW, backend_ab  # noqa: E402

from switchyard.engine.chat.grammar import GrammarMasker  # noqa: E402
from switchyard.engine.core.output import OutputStage  # noqa: E402


def _entry(name: str) -> tuple[str, int | None, bool]:
    """--backends' entry -> (the registry's backend name, graph parts or None, the GPU argmax on)."""
    name, _, parts = name.partition("@")
    backend = name.removesuffix("+torch-argmax")
    return backend, int(parts) if parts else None, backend == name


def _short(name: str) -> str:
    """A kernel's name without its template arguments and parameters."""
    name = re.sub(r"<.*>", "<>", name)
    return re.sub(r"\(.*\)", "", name)[:70]


def kernel_profile(m: Any, batch: int, steps: int, vocab: int, tok: Any, grammar: Any, overlap: bool) -> list[str]:
    """Markdown lines: the GPU's time, busy and idle time a step over `steps` steady decode steps
    (after the prefill and the first async turns), and the kernels by time a step."""
    from torch.profiler import ProfilerActivity, profile, schedule

    skip = ec.WARM + 4
    gpu = m.device.type == "cuda"  # else the host's ops (a smoke test of this function)
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU],
                 schedule=schedule(skip_first=skip, wait=0, warmup=1, active=steps, repeat=1)) as prof:
        ec.decode_rate(m, batch, skip + steps + 4, vocab, tok=tok, grammar=grammar, overlap=overlap,
                       on_step=prof.step)
    return kernel_table(prof, steps, gpu)


def peer_profile(c: Any, dev: torch.device, batch: int, steps: int) -> list[str]:
    """As kernel_profile, for the compiled PyTorch peer's decode step (bench/peer_compiled.py), after
    its compile, warm-up and capture."""
    from peer_compiled import PROMPT, PeerLlama
    from torch.profiler import ProfilerActivity, profile, schedule

    m = PeerLlama(c, dev, batch, PROMPT + steps + 16)
    nxt = m.prefill(torch.randint(0, c.vocab_size, (batch, PROMPT)))
    pos = PROMPT
    gpu = dev.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU],
                 schedule=schedule(skip_first=4, wait=0, warmup=1, active=steps, repeat=1)) as prof:
        for _ in range(4 + 1 + steps + 1):
            nxt = torch.tensor(m.decode(nxt, pos), device=dev)
            pos += 1
            prof.step()
    return kernel_table(prof, steps, gpu)


def kernel_table(prof: Any, steps: int, gpu: bool) -> list[str]:
    """Markdown lines of a profile of `steps` steps: the GPU's time, busy and idle time a step and
    its kernels by time a step."""
    from torch.autograd import DeviceType

    evs = sorted((e for e in prof.events() if e.device_type == (DeviceType.CUDA if gpu else DeviceType.CPU)),
                 key=lambda e: e.time_range.start)
    if not evs:
        return ["no events recorded"]
    busy, end = 0.0, evs[0].time_range.start
    gaps: list[float] = []
    for e in evs:
        s, t = e.time_range.start, e.time_range.end
        if s > end:
            gaps.append(s - end)
        busy += max(0.0, t - max(s, end))
        end = max(end, t)
    span = end - evs[0].time_range.start
    per: dict[str, list[float]] = collections.defaultdict(list)
    for e in evs:
        per[_short(e.name)].append(e.time_range.end - e.time_range.start)
    big = [g for g in gaps if g >= 20]
    lines = [f"{steps} steps: GPU time {span / steps / 1000:.3f} ms a step, busy {busy / steps / 1000:.3f} ms "
             f"({busy / span:.0%}), idle {(span - busy) / steps / 1000:.3f} ms a step, of which gaps of 20 us or "
             f"more {sum(big) / steps / 1000:.3f} ms ({len(big) / steps:.1f} a step); "
             f"{len(evs) / steps:.0f} kernels and copies a step", "",
             "| kernel | a step | us each | ms a step | share of busy |", "| --- | --- | --- | --- | --- |"]
    for name, ts in sorted(per.items(), key=lambda kv: -sum(kv[1]))[:30]:
        lines.append(f"| `{name}` | {len(ts) / steps:.1f} | {sum(ts) / len(ts):.2f} | {sum(ts) / steps / 1000:.3f} | "
                     f"{sum(ts) / busy:.1%} |")
    return lines + step_order(evs, {n for n, ts in per.items() if len(ts) >= 8 * steps})


KINDS = (("attention", ("sdpa", "flash", "fmha", "attention", "attn")),
         ("GEMM", ("gemm", "nvjet", "xmma", "cutlass", "cublas")))


def kernel_kind(name: str) -> str:
    """A prefill kernel's part: attention, GEMM (the projections and the head) or other."""
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "other")


def prefill_flops(c: Any, n: int) -> dict[str, float]:
    """What an n-token prompt asks for: the projections' and the head's multiply-adds (the head on
    the last row only) and causal attention's (QK^T and PV, half the square), as FLOPs."""
    h, q, kv = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * c.intermediate_size
    return {"GEMM": 2.0 * (n * per_layer * c.num_layers + h * c.vocab_size),
            "attention": 2.0 * 2 * c.num_layers * c.num_heads * c.head_dim * n * (n + 1) / 2}


def prefill_profile(m: Any, c: Any, n: int, rounds: int = 3) -> list[str]:
    """Markdown lines: one n-token prefill's GPU time by part (kernel_kind) and its kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    gpu = m.device.type == "cuda"
    ec.ttft(m, n, c.vocab_size, reps=1)  # compiles, warms cuBLAS's and cuDNN's choices
    variants: dict[str, dict[str, Any]] = {"ours": {}, "every row": EVERY_ROW}  # the last layer on every row
    if hasattr(m.backend, "PREFILL_GLUE"):  # the cuda backend's KV write and add + norm as the torch backend's
        variants["torch glue"] = {"PREFILL_GLUE": False}
    with ClockWatch(gpu) as clocks:
        walls = backend_ab(m.backend, lambda: ec.ttft(m, n, c.vocab_size, reps=3), rounds, variants,
                           settle_s=1.0 if gpu else 0.0)
    wall = statistics.median(walls["ours"])
    launched = []  # the host's share: until forward() returns, every kernel queued
    for _ in range(3):
        ids, lens = torch.randint(0, c.vocab_size, (1, n)), torch.tensor([n])
        ec.sync(m.device)
        t0 = time.perf_counter()
        logits = m.forward(ec.Step(ids, torch.arange(n).view(1, n), torch.tensor([0]), lens, lens, 0))
        launched.append((time.perf_counter() - t0) * 1000)
        int(logits.argmax(-1)[0])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] if gpu else [ProfilerActivity.CPU]) as prof:
        ec.ttft(m, n, c.vocab_size, reps=1)
    evs = [e for e in prof.events() if e.device_type == (DeviceType.CUDA if gpu else DeviceType.CPU)]
    if not evs:
        return ["no events recorded"]
    host = [e for e in prof.events() if gpu and e.device_type == DeviceType.CPU]
    span = max(e.time_range.end for e in evs) - min(e.time_range.start for e in evs)
    by_kind: dict[str, float] = collections.defaultdict(float)
    per: dict[str, list[float]] = collections.defaultdict(list)
    for e in evs:
        t = e.time_range.end - e.time_range.start
        by_kind[kernel_kind(e.name)] += t
        per[_short(e.name)].append(t)
    flops = prefill_flops(c, n)
    busy = sum(by_kind.values())
    lines = [f"{n}-token prefill: {wall:.1f} ms wall (median of {rounds} rounds of 3, unprofiled; alternated with "
             + ", ".join(f"{k} {statistics.median(ts):.1f} ms" for k, ts in walls.items() if k != "ours") + "; rounds: "
             + "; ".join(f"{k} " + ", ".join(f"{t:.1f}" for t in ts) for k, ts in walls.items()) + "), "
             "forward() returned after "
             f"{statistics.median(launched):.1f} ms (its launches queued); GPU span {span / 1000:.1f} ms, "
             f"kernels {busy / 1000:.1f} ms, {len(evs)} kernels and copies", "", clocks.summary(), "",
             "| part | ms | share of kernels | TFLOP/s |", "| --- | --- | --- | --- |"]
    for kind in ("GEMM", "attention", "other"):
        t = by_kind.get(kind, 0.0)
        rate = f"{flops[kind] / (t * 1e-6) / 1e12:.0f}" if kind in flops and t else ""
        lines.append(f"| {kind} | {t / 1000:.2f} | {t / busy:.1%} | {rate} |")
    lines += ["", f"FLOPs asked: GEMM {flops['GEMM'] / 1e12:.1f} T, attention {flops['attention'] / 1e12:.1f} T", "",
              "| kernel | part | count | ms | share |", "| --- | --- | --- | --- | --- |"]
    for name, ts in sorted(per.items(), key=lambda kv: -sum(kv[1]))[:20]:
        lines.append(f"| `{name}` | {kernel_kind(name)} | {len(ts)} | {sum(ts) / 1000:.2f} | {sum(ts) / busy:.1%} |")
    return lines + host_calls(host, evs)


def host_calls(host: list[Any], kernels: list[Any]) -> list[str]:
    """Markdown lines: the host's time outside the GPU's span (before the first kernel, after the last)
    and its CUDA runtime calls by time, where a call that waits for the GPU or allocates shows."""
    if not host:
        return []
    start, end = min(e.time_range.start for e in host), max(e.time_range.end for e in host)
    k0, k1 = min(e.time_range.start for e in kernels), max(e.time_range.end for e in kernels)
    calls: dict[str, list[float]] = collections.defaultdict(list)
    for e in host:
        if e.name.startswith(("cuda", "cu")):
            calls[e.name].append(e.time_range.end - e.time_range.start)
    lines = ["", f"## The host (profiled run): {(k0 - start) / 1000:.1f} ms before the first kernel, "
             f"{(end - k1) / 1000:.1f} ms after the last", "",
             "| runtime call | count | ms | longest ms |", "| --- | --- | --- | --- |"]
    for name, ts in sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:12]:
        lines.append(f"| `{name}` | {len(ts)} | {sum(ts) / 1000:.2f} | {max(ts) / 1000:.2f} |")
    return lines


SUSTAINED = 150  # calls back to back: a long prefill's share of one kernel, where clocks settle under load


def _per_call_ms(fn: Any, dev: torch.device, reps: int = 5) -> float:
    """Milliseconds a call of fn, back to back, after two warm-up calls."""
    for _ in range(2):
        fn()
    ec.sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    ec.sync(dev)
    return (time.perf_counter() - t0) * 1000 / reps


def attention_rates(c: Any, n: int, dev: torch.device) -> list[str]:
    """Markdown lines: one layer's causal attention over an n-token prompt through each of SDPA's
    kernels, with the KV heads shared (enable_gqa) and expanded to the query heads beforehand (what a
    kernel without GQA needs; the expansion's copy not counted), in heads-major tensors and in the
    engine's tokens-major views ([n, heads, D] transposed, as rope_split writes them): which kernel a
    prefill should ask for, and whether the engine's layout costs it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
    heads_major = [torch.randn(1, h, n, D, device=dev, dtype=torch.bfloat16) for h in (H, Hkv, Hkv)]
    tokens_major = [torch.randn(n, h, D, device=dev, dtype=torch.bfloat16).view(1, n, h, D).transpose(1, 2)
                    for h in (H, Hkv, Hkv)]
    flops = prefill_flops(c, n)["attention"] / c.num_layers
    lines = ["| SDPA kernel | KV heads | layout | ms a layer | TFLOP/s |", "| --- | --- | --- | --- | --- |"]
    for kernel in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        for layout, (q, k, v) in (("heads-major", heads_major), ("tokens-major", tokens_major)):
            wide = [t.repeat_interleave(H // Hkv, dim=1) for t in (k, v)]
            for label, (kk, vv), gqa in (("shared", (k, v), True), ("expanded", wide, False)):
                if layout == "tokens-major" and not gqa:
                    continue  # the engine shares them
                try:
                    with sdpa_kernel([kernel]):
                        ms = _per_call_ms(lambda q=q, kk=kk, vv=vv, gqa=gqa: sdpa(q, kk, vv, is_causal=True,
                                                                                  enable_gqa=gqa), dev)
                    lines.append(f"| {kernel.name} | {label} | {layout} | {ms:.3f} | "
                                 f"{flops / (ms * 1e-3) / 1e12:.0f} |")
                    if kernel == SDPBackend.CUDNN_ATTENTION and layout == "tokens-major":  # as the prefill runs it
                        ms = _per_call_ms(lambda q=q, kk=kk, vv=vv: sdpa(q, kk, vv, is_causal=True, enable_gqa=True),
                                          dev, reps=SUSTAINED)
                        lines.append(f"| {kernel.name} | {label} | {layout}, {SUSTAINED} back to back | {ms:.3f} | "
                                     f"{flops / (ms * 1e-3) / 1e12:.0f} |")
                except RuntimeError as e:  # the kernel refuses this shape or GPU
                    lines.append(f"| {kernel.name} | {label} | {layout} | refused: {str(e).splitlines()[0][:80]} | |")
    return lines


def gemm_rates(c: Any, n: int, dev: torch.device) -> list[str]:
    """Markdown lines: each of a layer's projections alone over n rows (torch's cuBLAS matmul, bf16),
    back to back: the rate the prefill's GEMMs would reach outside the prefill."""
    h, q, kv, inter = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    lines = [f"| projection | [rows, in] x [in, out] | ms | TFLOP/s | ms, {SUSTAINED} back to back | TFLOP/s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, k, out in (("qkv", h, q + 2 * kv), ("o", q, h), ("gate_up", h, 2 * inter), ("down", inter, h)):
        a = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(out, k, device=dev, dtype=torch.bfloat16) / k ** 0.5
        row = f"| {name} | [{n}, {k}] x [{k}, {out}] |"
        for reps in (5, SUSTAINED):
            ms = _per_call_ms(lambda a=a, w=w: torch.nn.functional.linear(a, w), dev, reps)
            row += f" {ms:.3f} | {2.0 * n * k * out / (ms * 1e-3) / 1e12:.0f} |"
        lines.append(row)
    return lines


def step_order(evs: list[Any], layered: set[str]) -> list[str]:
    """One step's kernels and copies in the order the GPU ran them, those of every layer as one
    run of them: from the middle step's first event after an argmax (the step before's end) to
    the next argmax. Where a step's small launches sit, and the gap before each (us)."""
    ends = [i for i, e in enumerate(evs) if "argmax" in e.name]
    if len(ends) < 3:
        return []
    k = len(ends) // 2
    lines = ["", "One step in order (a run of layer kernels folded; gap: idle before it, us):", "",
             "| # | kernel | us | gap |", "| --- | --- | --- | --- |"]
    run, n, prev_end = 0, 0, evs[ends[k - 1]].time_range.end
    for e in evs[ends[k - 1] + 1: ends[k] + 1]:
        name, took, gap = _short(e.name), e.time_range.end - e.time_range.start, e.time_range.start - prev_end
        prev_end = max(prev_end, e.time_range.end)
        if name in layered:
            run += 1
            continue
        if run:
            lines.append(f"| | ({run} layer kernels) | | |")
            run = 0
        n += 1
        lines.append(f"| {n} | `{name}` | {took:.2f} | {gap:.2f} |")
    return lines


# The host's turn by part (--host-split): (label, module, owner, attribute), each wrapped in a timer.
# Inclusive: "output: finish" holds "wait: step in flight's tokens" and "grammar: accept", "output: sample"
# holds the masker, whose "masks: llguidance fill" and "masks: upload + kernel" are beside each other.
SPLIT = [("scheduler: step (all)", "switchyard.engine.core.scheduler", "Scheduler", "step"),
         ("runner: launch the step", "switchyard.engine.runner.model_runner", "Runner", "run"),
         ("graph runner: stage + replay", "switchyard.engine.model.graph_runner", "GraphRunner", "run"),
         ("graphs: replay the parts", "switchyard.engine.backends.cuda.graphs", "DecodeGraphs", "run"),
         ("output: finish (host share)", "switchyard.engine.core.output", "OutputStage", "finish"),
         ("wait: step in flight's tokens", "switchyard.engine.backends.transfer", "Download", "get"),
         ("grammar: accept", "switchyard.engine.chat.grammar", "GrammarState", "accept"),
         ("output: sample (queue)", "switchyard.engine.core.output", "OutputStage", "sample"),
         ("masks: apply (fill + kernel)", "switchyard.engine.chat.grammar", "GrammarMasker", "apply"),
         ("masks: upload + kernel", "switchyard.engine.backends.cuda.token_mask", None, "apply_token_bitmask_cuda"),
         ("sampling: tokens (queue)", "switchyard.engine.core.output", None, "sample_tokens"),
         ("download: start", "switchyard.engine.backends.transfer", "Download", "__init__")]


def host_split(run: Any, repeat: int) -> list[str]:
    """run() `repeat` times with each of SPLIT's parts timed: lines of ms a scheduler step, inclusive
    (a tool call's rows finish after a few dozen tokens: the repeats make the count up)."""
    import functools
    import importlib
    import time

    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    undo = []
    for label, mod, owner, attr in SPLIT:
        try:
            holder = getattr(importlib.import_module(mod), owner) if owner else importlib.import_module(mod)
        except ImportError:
            continue
        fn = getattr(holder, attr)

        def timed(*args: Any, _fn: Any = fn, _label: str = label, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kw)
            finally:
                spent[_label] += time.perf_counter() - t0
                calls[_label] += 1
        setattr(holder, attr, functools.wraps(fn)(timed))
        undo.append((holder, attr, fn))
    # grammar.fused_mask keeps the kernel's entry it found first: find the timed one now, the plain one after
    fused = importlib.import_module("switchyard.engine.chat.grammar").fused_mask
    fused.cache_clear()
    try:
        rs = [run() for _ in range(repeat)]
    finally:
        for holder, attr, fn in undo:
            setattr(holder, attr, fn)
        fused.cache_clear()
    steps = max(1, calls["scheduler: step (all)"])
    rates = ", ".join(f"{r['tok_s']:.0f}" for r in rs)
    fill = [r["mask_ms"] for r in rs if "mask_ms" in r]
    lines = [f"{rates} tok/s, step {statistics.median(r['step_ms'] for r in rs):.3f} ms (timers on); {steps} "
             f"scheduler steps" + (f"; llguidance's fill a step: median {statistics.median(fill):.3f} ms" if fill else ""),
             "",
             "| part (inclusive) | calls a step | ms a step |", "| --- | --- | --- |"]
    for label, *_ in SPLIT:
        if calls[label]:
            lines.append(f"| {label} | {calls[label] / steps:.2f} | {spent[label] / steps * 1000:.4f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(ec.SHAPES))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--prompt", type=int, default=ec.PROMPT, help="prompt tokens a row (the decode steps' span bucket)")
    ap.add_argument("--grammar", nargs="?", const="items", default="", choices=["", "items", "tools"],
                    help="every row under bench/engine_cuda.py's JSON grammar (items) or its tool call's (tools)")
    ap.add_argument("--host-split", default="", help="comma-separated free|items|tools: the host's turn by part "
                    "for each, alternated --rounds times (see above)")
    ap.add_argument("--rounds", type=int, default=2, help="--host-split: rounds")
    ap.add_argument("--sync", action="store_true", help="no async decode")
    ap.add_argument("--sync-debug", action="store_true", help="print where the host waits for the device")
    ap.add_argument("--kernels", type=int, default=0, help="profile this many decode steps' kernels (see above)")
    ap.add_argument("--backends", default="auto", help="--kernels: the decode backends profiled (registry names; "
                    "'peer': the compiled PyTorch peer, bench/peer_compiled.py; NAME+inline-masks: grammar masks filled in line, not ahead)")
    ap.add_argument("--out", default="", help="--kernels: the folder its table goes to")
    ap.add_argument("--prefill", type=int, default=0, help="profile one prefill of this many tokens (see above)")
    ap.add_argument("--prefill-rounds", type=int, default=3,
                    help="--prefill's alternated rounds of its wall time, the last layer on last rows and on every row")
    a = ap.parse_args()
    ec.PROMPT = a.prompt  # decode_rate's prompts
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    c = ec.SHAPES[a.shape]
    w = ec.random_weights(c, seed=0, device=dev, dtype=torch.bfloat16)
    m = ec.Decoder(c, ec.Shard(0, 1, c), w, ec.SingleRank(), max_slots=a.batch,
                   max_len=max(ec.PROMPT + ec.WARM + max(a.tokens, a.kernels + 16), a.prefill) + 16, device=dev, dtype=torch.bfloat16,
                   cuda_graphs=True, backend="auto" if dev.type == "cuda" else "torch")
    if a.prefill:
        print("\n".join([f"# A prefill's GPU time by part: {a.shape}, "
                         f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}", "",
                         *prefill_profile(m, c, a.prefill, a.prefill_rounds), "", "## Attention alone, a layer", "",
                         *attention_rates(c, a.prefill, dev), "", "## The projections alone, a layer", "",
                         *gemm_rates(c, a.prefill, dev)]), flush=True)
        return
    tok = ec.shape_tokenizer(c)
    gtok = ec.smollm2_tokenizer() or tok  # the grammars' tokenizer (the 8B shape's wraps SmolLM2's, as the bench's does)
    make = ec.grammar_factory(gtok, tool_calls=a.grammar == "tools") if a.grammar else None
    if a.host_split:
        makes = {"free": None, "items": ec.grammar_factory(gtok), "tools": ec.grammar_factory(gtok, tool_calls=True)}
        for g in makes.values():
            ec.decode_rate(m, a.batch, 8, c.vocab_size, tok=tok, grammar=g)  # compiles, captures the graphs
        print(f"# The host's turn by part: {a.shape}, batch {a.batch}, "
              f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}", flush=True)
        for i in range(a.rounds):
            for name in a.host_split.split(","):
                lines = host_split(lambda g=makes[name]: ec.decode_rate(m, a.batch, a.tokens, c.vocab_size, tok=tok,
                                                                          grammar=g), 1 if name != "tools" else 8)
                print("\n".join(["", f"## round {i}: {name}", "", *lines]), flush=True)
        return
    if a.kernels:
        lines = [f"# Kernels of a decode step: {a.shape}, batch {a.batch}, {'sync' if a.sync else 'async decode'}"
                 f"{', grammar' if a.grammar else ''}", "",
                 f"`python bench/engine_cuda_profile.py {' '.join(sys.argv[1:])}` on "
                 f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}"]
        served_ahead = GrammarMasker.AHEAD
        for name in a.backends.split(","):
            try:
                if name == "peer":
                    lines += ["", "## the compiled PyTorch peer (bench/peer_compiled.py)", ""]
                    lines += peer_profile(c, dev, a.batch, a.kernels)
                else:
                    backend, parts, gpu_argmax = _entry(name.removesuffix("+inline-masks"))
                    OutputStage.GPU_ARGMAX = gpu_argmax  # read at a scheduler's first GPU step
                    GrammarMasker.AHEAD = served_ahead and not name.endswith("+inline-masks")  # read at each masking
                    v = m if backend == "auto" else m.view(backend, cuda_graphs=True, max_slots=a.batch,
                                                           graph_parts=parts)
                    ec.decode_rate(v, a.batch, 8, c.vocab_size, tok=tok, grammar=make)  # compiles, captures graphs
                    r = ec.decode_rate(v, a.batch, 32, c.vocab_size, tok=tok, grammar=make, overlap=not a.sync)
                    lines += ["", f"## {name if backend != 'auto' else v.backend_name}: {r['tok_s']:.0f} tok/s "
                              f"unprofiled, step {r['step_ms']:.3f} ms", ""]
                    lines += kernel_profile(v, a.batch, a.kernels, c.vocab_size, tok, make, not a.sync)
            except Exception as e:  # one backend failing must not lose the others' tables
                lines += ["", f"## {name}: FAILED {type(e).__name__}: {str(e)[:300]}"]
            print("\n".join(lines[-12:]), flush=True)
            if a.out:
                Path(a.out).mkdir(parents=True, exist_ok=True)
                (Path(a.out) / f"kernels_{a.shape}_b{a.batch}.md").write_text("\n".join(lines) + "\n")
        return
    ec.decode_rate(m, a.batch, 8, c.vocab_size, tok=tok, grammar=make)  # compiles, captures the graphs
    waits: collections.Counter[str] = collections.Counter()
    if a.sync_debug:
        def seen(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
            stack = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
            waits[f"{message}\n" + "".join(traceback.format_list(stack[-6:]))] += 1

        warnings.showwarning = seen
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
    r = ec.decode_rate(m, a.batch, a.tokens, c.vocab_size, tok=tok, grammar=make, overlap=not a.sync)
    if a.sync_debug:
        torch.cuda.set_sync_debug_mode("default")
        for where, n in waits.most_common(8):
            print(f"--- {n} host waits at:\n{where}")
    print(f"{a.shape} b={a.batch} {'grammar' if a.grammar else 'free'}{' sync' if a.sync else ''}: "
          f"{r['tok_s']:.0f} tok/s, step {r['step_ms']:.3f} ms" + (f", mask fill {r['mask_ms']:.3f} ms" if "mask_ms" in r else ""))


if __name__ == "__main__":
    main()
