"""bench/engine_cuda.py's --ttft-fp8 mode: an 8k prompt's TTFT with the prefill's projections in
bf16, in FP8 (--prefill-fp8, backends/cuda/fp8.py) and in FP8 with fast accumulation, alternated in
one process, and each FP8 variant's last-position logits against bf16's over random prompts."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import torch

from switchyard.engine.model.decoder import Decoder
from switchyard.engine.model.step import Step

# --ttft-fp8's variants of the prefill: fp8.py's module knobs, set for one prefill. bf16: the FP8
# copies present but never used (their threshold out of reach), as a server without --prefill-fp8.
FP8_VARIANTS: dict[str, dict[str, Any]] = {"bf16": {"PREFILL_TOKENS": 1 << 62}, "fp8": {},
                                           "fp8, fast accum": {"FAST_ACCUM": True}}


def fp8_ttft(m: Decoder, ttft: Callable[..., float], lens: list[int], vocab: int, rounds: int, prompts: int, add: Callable[..., None],
             log: Callable[[str], None]) -> None:
    """--ttft-fp8: one prompt's TTFT (`ttft`, engine_cuda.py's: the prefill, its logits' argmax read back) with the
    projections in bf16 and on the decoder's FP8 copies (--prefill-fp8), the variants alternated
    `rounds` times, each round's figure the median of 3, reported as the medians of the rounds;
    then `prompts` random prompts through every variant, each FP8 variant's last-position logits
    against bf16's (top-1 agreement, max |difference| in bf16's std)."""
    from switchyard.engine.backends.cuda import fp8

    if not fp8.carried(m.layers):
        log("  ttft-fp8: skipped (the decoder has no FP8 copies: a cuda backend on an sm89+ GPU makes them)")
        return

    @contextlib.contextmanager
    def variant(knobs: dict[str, Any]) -> Iterator[None]:
        saved = {k: getattr(fp8, k) for k in knobs}
        for k, v in knobs.items():
            setattr(fp8, k, v)
        try:
            yield
        finally:
            for k, v in saved.items():
                setattr(fp8, k, v)

    log(f"  fp8 start-up check (model/warmup.py's): {fp8.check(m.layers) or 'passed'}")
    m.allocate_cache(1, max(lens) + 16)
    for n in lens:
        for knobs in FP8_VARIANTS.values():  # compiles the quantisation kernels, picks cuBLAS's FP8 kernels
            with variant(knobs):
                ttft(m, n, vocab, reps=1)
        times: dict[str, list[float]] = {k: [] for k in FP8_VARIANTS}
        for i in range(rounds):
            for name, knobs in FP8_VARIANTS.items():
                with variant(knobs):
                    times[name].append(ttft(m, n, vocab))
            log(f"    round {i} prompt {n}: " + ", ".join(f"{k} {v[-1]:.1f} ms" for k, v in times.items()))
        g = torch.Generator().manual_seed(n)
        agree = {k: 0 for k in FP8_VARIANTS}
        worst = {k: 0.0 for k in FP8_VARIANTS}
        flips: dict[str, list[float]] = {k: [] for k in FP8_VARIANTS}  # bf16's top-2 gap where top-1 differs
        lens_t = torch.tensor([n])
        for _ in range(prompts):
            step = Step(torch.randint(0, vocab, (1, n), generator=g), torch.arange(n).view(1, n), torch.tensor([0]),
                        lens_t, lens_t, 0)
            logits = {}
            for k, knobs in FP8_VARIANTS.items():
                with variant(knobs):
                    logits[k] = m.forward(step).float()
            ref = logits["bf16"]
            top2 = ref[0].topk(2).values
            for k, v in logits.items():
                same = bool(v.argmax(-1)[0] == ref.argmax(-1)[0])
                agree[k] += same
                if not same:
                    flips[k].append(float((top2[0] - top2[1]) / ref.std()))
                worst[k] = max(worst[k], float((v - ref).abs().max() / ref.std()))
        bf16 = statistics.median(times["bf16"])
        for name, ts in times.items():
            med = statistics.median(ts)
            note = (f"prompt {n}, median of {rounds} rounds ({', '.join(f'{t:.1f}' for t in ts)}); {med / bf16:.3f}x "
                    f"bf16; top-1 = bf16's {agree[name]}/{prompts}"
                    + (f" (bf16's top-2 gap where not: {', '.join(f'{x:.3f}' for x in flips[name])} x std)"
                       if flips[name] else "") + f", max logit diff {worst[name]:.3f} x std")
            add(f"ours (prefill {name})", "ttft_ms", 1, med, "ms", note)
            if name != "bf16":
                add(f"ours (prefill {name})", "top1_vs_bf16", 1, agree[name] / max(1, prompts), "x",
                    f"prompt {n}, {prompts} random prompts")
