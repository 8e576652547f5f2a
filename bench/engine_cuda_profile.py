"""One decode run of the served loop (bench/engine_cuda.py's decode_rate), long enough to profile
the host's share of a step, free or under a grammar; run it under py-spy:

  py-spy record -r 1000 -f raw -o grammar.txt -- python bench/engine_cuda_profile.py --grammar
  python bench/engine_cuda_profile.py --shape smollm2-135m --batch 1 --tokens 3000   # free

Prints the decode rate; random bf16 weights of the shape, CUDA graphs, async decode. --sync-debug
turns on torch's CUDA sync debug mode for the measured run and prints where the host waited for
the device (each distinct Python stack, with its count): under async decode only the tokens' read
(Download.get) should appear.
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_cuda as ec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(ec.SHAPES))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--grammar", action="store_true", help="every row under bench/engine_cuda.py's JSON grammar")
    ap.add_argument("--sync", action="store_true", help="no async decode")
    ap.add_argument("--sync-debug", action="store_true", help="print where the host waits for the device")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    c = ec.SHAPES[a.shape]
    w = ec.random_weights(c, seed=0, device=dev, dtype=torch.bfloat16)
    m = ec.Decoder(c, ec.Shard(0, 1, c), w, ec.SingleRank(), max_slots=a.batch,
                   max_len=ec.PROMPT + ec.WARM + a.tokens + 16, device=dev, dtype=torch.bfloat16, cuda_graphs=True,
                   backend="auto" if dev.type == "cuda" else "torch")
    tok = ec.shape_tokenizer(c)
    make = ec.grammar_factory(tok) if a.grammar else None
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
