"""What splitting a step's grammar masks over threads buys, by how the rows' matchers share state.

The engine fills a step's masks row after row on its own thread (chat/grammar.GrammarMasker): every
row's matcher is a copy of one compiled grammar, and the copies share its lexer. At SmolLM2 batch 16
on the H200 that fill (1-1.3 ms) is the step's pace (bench/results/gpu_grammar2), and llguidance's
pool of 8 did not shorten it. This asks why, on this machine's cores:

  PYTHONPATH=. python bench/grammar_fill_threads.py                 # 16 rows, 1 and 2 threads, 5 rounds
  PYTHONPATH=. python bench/grammar_fill_threads.py --threads 1,2,4,8 --rows 16 --rounds 5

For each grammar (`items`: bench/engine_cuda.py's worst case, strings under patterns; `tools`: a
`tool_choice: required` call of bench/grammar.py's two tools, plain strings), token streams are
drawn once, as the GPU bench's random weights write them (each step the argmax of random logits
under the mask), then replayed through each layout, the layouts alternated round by round:

- `copies`: copies of one compiled grammar, the rows split over T threads;
- `own lexer`: each thread's rows copied from a grammar compiled for that thread alone;
- `own tokenizer`: as `own lexer`, each thread's grammar also on a tokenizer of its own;
- `process pool`: as the served fill process: a compilation per lane (two a thread), llguidance's pool of T;
- `process pool, tokenizers`: as `process pool`, lane k's grammar on tokenizer k % T (one tokenizer a thread);
- `engine pool`: the engine's own classes, copies from chat/grammar.Grammars filled by GrammarMasker(threads=T)
  (llguidance's pool); its fill time as the masker records it. (Once the engine's "lanes", a compilation
  per thread: 1.87x here with 8 threads on the GPU host, and a loss in the served loop while the fill ran on
  the engine's thread, bench/results/gpu_grammar_lanes, so taken out; with the fill on the masker's own
  thread they won, bench/results/gpu_step_cuts, and came back as Grammars(lanes=), a GPU replica's default.)

T = 1 is the in-line fill. A step's time is from the first row's fill to the last's (the threads
handed their rows and joined, as a masker would). Medians of the steps, then of the rounds.

--row-costs: instead, each row's fill timed alone (one thread): the percentiles of a row's time, a
step's sum and its costliest row (no pool can fill a step faster than that row), and the text before
the costliest fills with the number of tokens their masks allowed:

  PYTHONPATH=. python bench/grammar_fill_threads.py --row-costs

--warmup: a step's fill by window of steps (rows one after another) with the rows' matchers copied from one
compilation against one compilation a row, as a GPU replica's lanes compile them (each lexer warms alone), then
a second batch from the same compilations (warm, as a served fill process's later requests of a schema):

  PYTHONPATH=. python bench/grammar_fill_threads.py --warmup --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import llguidance
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
LAYOUTS = ("copies", "own lexer", "own tokenizer", "engine pool", "process pool", "process pool, tokenizers")


def tokenizer() -> Any:
    """SmolLM2's tokenizer: where gpu_check.sh prepare wrote it (the device), else from the GGUF."""
    from engine_cuda import smollm2_tokenizer
    from grammar import _tokenizer

    from switchyard.engine.serving import registry

    return smollm2_tokenizer() or _tokenizer(registry.pull("smollm2-135m"))


def grammars() -> dict[str, Any]:
    """The two grammars' constraints (chat/structured.Constraint), by name."""
    from engine_cuda_grammar import grammar_constraint

    return {"items": grammar_constraint(), "tools": grammar_constraint(tool_calls=True)}


class Rows:
    """One grammar's matchers for `rows` rows, laid out for `threads` threads."""

    def __init__(self, toks: list[Any], lark: str, rows: int, threads: int, layout: str) -> None:
        per = -(-rows // threads)
        self.parts = [(lo, min(rows, lo + per)) for lo in range(0, rows, per)]
        gram = llguidance.LLMatcher.grammar_from_lark(lark)
        tmpl = [llguidance.LLMatcher(toks[k if layout == "own tokenizer" else 0], gram, log_level=0)
                for k in range(1 if layout == "copies" else len(self.parts))]
        self.m = [tmpl[0 if layout == "copies" else k].deep_copy() for k, (lo, hi) in enumerate(self.parts)
                  for _ in range(lo, hi)]

    def fill(self, bm: torch.Tensor, lo: int, hi: int) -> None:
        row = bm.shape[1] * 4
        for i in range(lo, hi):
            self.m[i].unsafe_compute_mask_ptr(bm.data_ptr() + i * row, row)


def streams(lt: Any, V: int, lark: str, rows: int, steps: int, seed: int) -> list[list[int]]:
    """Each row's tokens: the argmax of random logits under its mask, step by step; a token that
    ends the reply is stored as its complement (~t): the row's matcher is reset after it."""
    r = Rows([lt], lark, rows, 1, "copies")
    bm = torch.full((rows, (V + 31) // 32), -1, dtype=torch.int32)
    bits = 1 << torch.arange(32, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    out: list[list[int]] = [[] for _ in range(rows)]
    for _ in range(steps):
        r.fill(bm, 0, rows)
        allowed = ((bm.to(torch.int64).unsqueeze(-1) & bits) != 0).reshape(rows, -1)[:, :V]
        logits = torch.randn(rows, V, generator=g).masked_fill(~allowed, float("-inf"))
        for i, t in enumerate(logits.argmax(-1).tolist()):
            if not r.m[i].consume_token(t):
                raise RuntimeError(f"row {i}: the mask allowed {t}, the matcher refused it")
            if r.m[i].is_stopped():  # a finished reply: the row starts another, so it stays constrained
                r.m[i].reset()
                t = ~t
            out[i].append(t)
    return out


def take(m: Any, t: int) -> None:
    """A stream's token into its matcher (a complement: the reply's last, then a new reply)."""
    m.consume_token(t if t >= 0 else ~t)
    if t < 0:
        m.reset()


def step_fills(fill: Callable[[], None], matchers: list[Any], tokens: list[list[int]]) -> list[float]:
    """Each step's fill() timed, s; after it, row i's matcher takes tokens[i]'s token of the step."""
    times = []
    for s in range(len(tokens[0])):
        t0 = time.perf_counter()
        fill()
        times.append(time.perf_counter() - t0)
        for m, row in zip(matchers, tokens, strict=True):
            take(m, row[s])
    return times


def replay(rows: Rows, tokens: list[list[int]], words: int, pool: ThreadPoolExecutor | None) -> float:
    """The median step's fill, ms."""
    bm = torch.full((len(rows.m), words), -1, dtype=torch.int32)

    def fill() -> None:
        if pool is None:
            rows.fill(bm, 0, len(rows.m))
            return
        futures = [pool.submit(rows.fill, bm, lo, hi) for lo, hi in rows.parts[1:]]
        rows.fill(bm, *rows.parts[0])
        for f in futures:
            f.result()
    return statistics.median(step_fills(fill, rows.m, tokens)) * 1000


def replay_pool(toks: list[Any], lark: str, tokens: list[list[int]], threads: int, per_tokenizer: bool) -> float:
    """As replay, the rows laid out as the served fill process lays them (chat/grammar_process): a compilation
    per lane (2 lanes a thread, row i on lane i), every row filled by one call to llguidance's pool of
    `threads`; with `per_tokenizer`, lane k's grammar compiled on tokenizer k % threads, else all on one."""
    from switchyard.engine.runner.options import grammar_lanes

    lanes = grammar_lanes(threads)
    gram = llguidance.LLMatcher.grammar_from_lark(lark)
    tmpl = [llguidance.LLMatcher(toks[k % threads if per_tokenizer else 0], gram, log_level=0) for k in range(lanes)]
    ms = [tmpl[i % lanes].deep_copy() for i in range(len(tokens))]
    words = (toks[0].vocab_size + 31) // 32
    bm = torch.full((len(ms), words), -1, dtype=torch.int32)
    pool = llguidance.LLExecutor(threads)
    todo = [(m, i) for i, m in enumerate(ms)]
    times = step_fills(lambda: pool.unsafe_compute_mask_ptr(todo, bm.data_ptr(), words * 4, len(ms)), ms, tokens)
    return statistics.median(times) * 1000


def replay_engine(tok: Any, c: Any, tokens: list[list[int]], threads: int) -> float:
    """As replay, through Grammars' copies and GrammarMasker(threads=threads)."""
    from switchyard.engine.chat.grammar import GrammarMasker, Grammars

    grammars = Grammars(tok.tok.to_str(), tok.vocab_size, sorted(tok.eos_ids))
    states = [grammars.compile(c) for _ in tokens]
    masker = GrammarMasker(tok.vocab_size, threads=threads)
    logits = torch.zeros(len(tokens), tok.vocab_size)
    times = []
    for s in range(len(tokens[0])):
        masker.apply(logits, list(states))
        times.append(masker.last_fill_s)
        for st, row in zip(states, tokens, strict=True):
            take(st.matcher, row[s])
    return statistics.median(times) * 1000


def row_costs(lt: Any, V: int, name: str, lark: str, rows: int, steps: int, slow_us: float = 150) -> None:
    """Each row's fill timed alone over random-weight token streams (see --row-costs)."""
    import collections

    tokens = streams(lt, V, lark, rows, steps, seed=0)
    r = Rows([lt], lark, rows, 1, "copies")
    words = (V + 31) // 32
    bm = torch.full((rows, words), -1, dtype=torch.int32)
    bits = 1 << torch.arange(32, dtype=torch.int64)
    each: list[float] = []
    sums: list[float] = []
    worst: list[float] = []
    slow: collections.Counter[tuple[str, int]] = collections.Counter()
    for s in range(steps):
        ts = []
        for i in range(rows):
            t0 = time.perf_counter()
            r.m[i].unsafe_compute_mask_ptr(bm.data_ptr() + i * words * 4, words * 4)
            ts.append(time.perf_counter() - t0)
            if ts[-1] * 1e6 > slow_us:
                allowed = int(((bm[i].to(torch.int64).unsqueeze(-1) & bits) != 0).sum())
                text = lt.decode_str([t if t >= 0 else ~t for t in tokens[i][:s]])
                slow[(text[-24:], allowed)] += 1
        each += ts
        sums.append(sum(ts))
        worst.append(max(ts))
        for m, row in zip(r.m, tokens, strict=True):
            take(m, row[s])

    def us(v: list[float], q: float) -> str:
        return f"{sorted(v)[int(q * (len(v) - 1))] * 1e6:.0f}"
    print(f"  {name:5s} a row's fill, us: p50 {us(each, .5)}, p90 {us(each, .9)}, p99 {us(each, .99)}; a step's sum "
          f"p50 {us(sums, .5)}; its costliest row p50 {us(worst, .5)}, p90 {us(worst, .9)}")
    for (text, allowed), n in slow.most_common(5):
        print(f"        {n:4d} fills over {slow_us:.0f} us after ...{text!r}: {allowed} tokens allowed")


def warmup(lt: Any, V: int, name: str, lark: str, rows: int, steps: int, rounds: int) -> None:
    """A step's fill (rows one after another) by window of steps, the rows copied from one fresh compilation
    against one a row (a GPU replica's lanes: each lexer warms alone), then a second batch of rows (other
    tokens) copied from the same compilations, as a served fill process's next requests of a schema are."""
    first, second = streams(lt, V, lark, rows, steps, seed=1), streams(lt, V, lark, rows, steps, seed=2)
    words = (V + 31) // 32
    gram = llguidance.LLMatcher.grammar_from_lark(lark)
    edges = sorted({e for e in (0, 20, 80, steps // 2, steps) if e <= steps})

    def batch(tmpl: list[Any], tokens: list[list[int]]) -> list[float]:
        ms = [tmpl[i % len(tmpl)].deep_copy() for i in range(rows)]
        bm = torch.full((rows, words), -1, dtype=torch.int32)

        def fill() -> None:
            for i, m in enumerate(ms):
                m.unsafe_compute_mask_ptr(bm.data_ptr() + i * words * 4, words * 4)
        return step_fills(fill, ms, tokens)

    for r in range(rounds):
        for compilations in (1, rows):
            tmpl = [llguidance.LLMatcher(lt, gram, log_level=0) for _ in range(compilations)]
            per = batch(tmpl, first)
            again = statistics.mean(batch(tmpl, second)) * 1e3
            windows = ", ".join(f"steps {lo}-{hi} {statistics.mean(per[lo:hi]) * 1e3:.3f}"
                                for lo, hi in zip(edges, edges[1:], strict=False))
            print(f"  {name:5s} round {r} {compilations:2d} compilation{'s' if compilations > 1 else ' '}: {windows} ms; "
                  f"all {statistics.mean(per) * 1e3:.3f}, a second batch from them {again:.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (1: in line)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--row-costs", action="store_true", help="each row's fill timed alone (see above)")
    ap.add_argument("--warmup", action="store_true",
                    help="a step's fill by window of steps, from one compilation against one a row (see warmup())")
    ap.add_argument("--slices", choices=["served", "by-length", "general"], default="served",
                    help="the tokenizer's llguidance slices: chat/grammar.SLICES, engine_cuda_grammar.BY_LENGTH, "
                         "llguidance's")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    from engine_cuda_grammar import BY_LENGTH

    from switchyard.engine.chat.grammar import ll_tokenizer

    sl = {"served": None, "by-length": BY_LENGTH, "general": llguidance.LLTokenizer.general_slices()}[a.slices]

    tok = tokenizer()
    V, words = tok.vocab_size, (tok.vocab_size + 31) // 32
    toks = [ll_tokenizer(tok.tok.to_str(), V, sorted(tok.eos_ids), sl) for _ in range(max(threads))]
    from switchyard.engine.backends.cpu.native import cpu_model

    print(f"{cpu_model()}, llguidance {getattr(llguidance, '__version__', '?')}, {a.rows} rows, {a.steps} steps"
          + f", {a.slices} slices" + ("; each row's fill alone" if a.row_costs else
             f", {a.rounds} rounds; a step's fill, the mean of each window of steps" if a.warmup else
             f", {a.rounds} rounds; ms a step's fill (median of steps; median and range of rounds)"))
    for name, c in grammars().items():
        lark = c.grammar
        if a.row_costs:
            row_costs(toks[0], V, name, lark, a.rows, a.steps)
            continue
        if a.warmup:
            warmup(toks[0], V, name, lark, a.rows, a.steps, a.rounds)
            continue
        tokens = streams(toks[0], V, lark, a.rows, a.steps, seed=0)
        res: dict[tuple[str, int], list[float]] = {}
        for _ in range(a.rounds):
            for t in threads:
                pool = ThreadPoolExecutor(t - 1) if t > 1 else None
                for layout in LAYOUTS if t > 1 else LAYOUTS[:1]:
                    # a fresh grammar each round: every layout starts with its lexer as cold
                    res.setdefault((layout, t), []).append(
                        replay_engine(tok, c, tokens, t) if layout == "engine pool"
                        else replay_pool(toks, lark, tokens, t, layout.endswith("tokenizers"))
                        if layout.startswith("process pool")
                        else replay(Rows(toks, lark, a.rows, t, layout), tokens, words, pool))
                if pool is not None:
                    pool.shutdown()
        base = statistics.median(res[("copies", 1)])
        for (layout, t), v in res.items():
            m = statistics.median(v)
            print(f"  {name:5s} {'in line' if t == 1 else f'{t} threads, {layout}':28s} {m:6.3f} ms "
                  f"({min(v):.3f}-{max(v):.3f})  {base / m:4.2f}x the in-line fill")


if __name__ == "__main__":
    main()
