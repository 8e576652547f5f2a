"""Where a grammar-constrained decode step's extra time goes, on one GPU: the served loop
(bench/engine_cuda.py's decode_rate) free, under the JSON grammar, and under the grammar with one
part of the masking taken out at a time:

  no accept     the masks filled and applied as in the grammar run, but the grammar never consumes
                a token (its state, and so its mask, stays the first step's)
  fill only     as `no accept`, without the GPU masking (the logits stay free)
  masking only  as `no accept`, the bitmask a fixed all-allowed one (no llguidance)

So grammar - no accept: the tokens' consumption (and the later states' dearer masks); no accept -
masking only: llguidance's fill; no accept - fill only: the masking on the GPU.

  python bench/grammar_parts.py --shape smollm2-135m --batches 1,16 --tokens 400

Random bf16 weights of the shape, CUDA graphs, async decode; the grammar needs SmolLM2's
tokenizer (bench/gpu_check.sh prepare). Prints one line a variant and batch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_cuda as ec  # noqa: E402
from engine_cuda_grammar import grammar_factory  # noqa: E402

from switchyard.engine.chat import grammar as gm  # noqa: E402


def variant(name: str) -> Any:
    """Patch the masker (and the grammar state) for one variant; returns the undo."""
    apply, accept = gm.GrammarMasker.apply, gm.GrammarState.accept

    def fill_only(self: gm.GrammarMasker, logits: torch.Tensor, states: list[Any]) -> None:
        todo = [(s.matcher, i) for i, s in enumerate(states) if s is not None]
        bm = self._buffer(len(states), logits.device.type == "cuda")
        row_bytes, base = self.words * 4, bm.data_ptr()
        for m, i in todo:
            m.unsafe_compute_mask_ptr(base + i * row_bytes, row_bytes)

    def masking_only(self: gm.GrammarMasker, logits: torch.Tensor, states: list[Any]) -> None:
        bm = self._buffer(len(states), logits.device.type == "cuda")
        bm.fill_(-1)
        gm.apply_token_bitmask(logits, bm, [i for i, s in enumerate(states) if s is not None])

    if name == "fill only":
        gm.GrammarMasker.apply = fill_only  # type: ignore[method-assign]
    elif name == "masking only":
        gm.GrammarMasker.apply = masking_only  # type: ignore[method-assign]
    if name not in ("free", "grammar"):  # the masks stay the first state's
        gm.GrammarState.accept = lambda self, token: None  # type: ignore[method-assign]

    def undo() -> None:
        gm.GrammarMasker.apply, gm.GrammarState.accept = apply, accept  # type: ignore[method-assign]
    return undo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(ec.SHAPES))
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    c = ec.SHAPES[a.shape]
    batches = ec.ints(a.batches)
    w = ec.random_weights(c, seed=0, device=dev, dtype=torch.bfloat16)
    m = ec.Decoder(c, ec.Shard(0, 1, c), w, ec.SingleRank(), max_slots=max(batches),
                   max_len=ec.PROMPT + ec.WARM + a.tokens + 16, device=dev, dtype=torch.bfloat16,
                   cuda_graphs=dev.type == "cuda", backend="auto" if dev.type == "cuda" else "torch")
    tok = ec.shape_tokenizer(c)
    make = grammar_factory(tok)
    for b in batches:
        ec.decode_rate(m, b, 8, c.vocab_size, tok=tok, grammar=make)  # compiles, captures the graphs
    for r in range(a.rounds):
        for b in batches:
            for name in ("free", "grammar", "fill only", "masking only", "no accept"):
                undo = variant(name)
                try:
                    res = ec.decode_rate(m, b, a.tokens, c.vocab_size, tok=tok,
                                         grammar=None if name == "free" else make)
                finally:
                    undo()
                print(f"round {r} {a.shape} b={b:<3} {name:13} {res['tok_s']:9.0f} tok/s  step {res['step_ms']:.3f} ms"
                      + (f"  mask fill {res['mask_ms']:.3f} ms" if "mask_ms" in res else ""), flush=True)


if __name__ == "__main__":
    main()
