"""A step's grammar masks split over processes, each filling its rows one after another, against one process
filling them all: whether llguidance's fill scales over processes where it did not over threads
(bench/grammar_fill_threads.py: its pool, and Python threads over rows with their own lexers and tokenizers,
0.8-1.0x the in-line fill).

  PYTHONPATH=. python bench/grammar_fill_procs.py                  # 16 rows, 1 and 2 processes, 150 steps
  PYTHONPATH=. python bench/grammar_fill_procs.py --procs 1,2,4 --rounds 3

The token streams are bench/grammar_fill_threads.py's (each step the argmax of random logits under the mask,
the items grammar's strings under patterns and a tool call's plain strings); process k of P takes rows k,
k + P, ..., builds its own tokenizer and matchers, and times its own fills; the processes start together (a
barrier) and run free, so a step's fill is the slowest process's mean. Rounds alternate the counts.

On the H100 hosts' 16-core Xeons 16 items rows took 0.771 ms a step in one process, 0.397 in two, 0.208 in four
(bench/results/gpu_fill_lanes, call 18). Served (chat/grammar_process split over processes, commit 67dc6aa,
taken out again) the split did not pay in the decode loop there (calls 18-19): each process spins waiting for
its next step beside the engine's thread.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _work(rows: list[int], tokens: list[list[int]], lark: str, q: Any, start: Any) -> None:
    import llguidance
    import torch
    from grammar_fill_threads import step_fills, tokenizer

    from switchyard.engine.chat.grammar import ll_tokenizer

    tok = tokenizer()
    words = (tok.vocab_size + 31) // 32
    lt = ll_tokenizer(tok.tok.to_str(), tok.vocab_size, sorted(tok.eos_ids))
    gram = llguidance.LLMatcher.grammar_from_lark(lark)
    ms = [llguidance.LLMatcher(lt, gram, log_level=0) for _ in rows]
    bm = torch.zeros((len(rows), words), dtype=torch.int32)

    def fill() -> None:
        for i, m in enumerate(ms):
            m.unsafe_compute_mask_ptr(bm.data_ptr() + i * words * 4, words * 4)
    start.wait()
    q.put(statistics.fmean(step_fills(fill, ms, [tokens[r] for r in rows])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--procs", default="1,2", help="comma-separated process counts")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    from grammar_fill_threads import grammars, streams, tokenizer

    from switchyard.engine.backends.cpu.native import cpu_model
    from switchyard.engine.chat.grammar import ll_tokenizer

    tok = tokenizer()
    lt = ll_tokenizer(tok.tok.to_str(), tok.vocab_size, sorted(tok.eos_ids))
    counts = [int(p) for p in a.procs.split(",")]
    print(f"{cpu_model()}, {a.rows} rows, {a.steps} steps, {a.rounds} rounds; ms a step's fill (mean of the steps, "
          f"the slowest process; median and range of the rounds)")
    ctx = mp.get_context("spawn")
    for name, c in grammars().items():
        tokens = streams(lt, tok.vocab_size, c.grammar, a.rows, a.steps, seed=0)
        res: dict[int, list[float]] = {}
        for _ in range(a.rounds):
            for n in counts:
                q, start = ctx.Queue(), ctx.Barrier(n)
                ps = [ctx.Process(target=_work, args=(list(range(k, a.rows, n)), tokens, c.grammar, q, start))
                      for k in range(n)]
                for p in ps:
                    p.start()
                res.setdefault(n, []).append(max(q.get() for _ in ps))
                for p in ps:
                    p.join()
        base = statistics.median(res[counts[0]])
        for n, v in res.items():
            m = statistics.median(v)
            print(f"  {name:5s} {n} process{'es' if n > 1 else '  '} {m * 1000:6.3f} ms ({min(v) * 1000:.3f}-"
                  f"{max(v) * 1000:.3f})  {base / m:4.2f}x {counts[0]} process{'es' if counts[0] > 1 else ''}")


if __name__ == "__main__":
    main()
