"""Constrained decoding on this CPU: what a step's grammar masks cost next to a decode step, what
compiling a grammar costs, and the measurement that chose llguidance over xgrammar.

  PYTHONPATH=. python bench/grammar.py                  # both parts, 3 rounds
  PYTHONPATH=. python bench/grammar.py --part engine    # our masker vs a decode step only
  PYTHONPATH=. python bench/grammar.py --part libraries # llguidance vs xgrammar only
  PYTHONPATH=. python bench/grammar.py --part slices --rounds 8  # a row's fill: llguidance's slices vs ours
  PYTHONPATH=. python bench/grammar.py --part handover --rounds 5 # the fill process's early tokens vs late

`engine`: the real runner (SmolLM2-135M Q4_1, `--dtype auto` as `engine serve` runs it) decodes a
batch of 1 and of 16 tool-call prompts; each step's logits go through our GrammarMasker (every row
constrained by a `tool_choice: required` grammar of two tools, the worst case), the sampler and
the matchers' accept, as the scheduler does. Prints the decode step and the masking per step
(medians), their ratio (goal: under 10%), and Grammars.compile first and cached.

`libraries`: llguidance and xgrammar (if installed: `pip install xgrammar`) fill the bitmasks
for the same grammars (tool calls required, auto with free text first, a JSON schema) over the
same token streams at batch 1 and 16; each library's batch API, 2 threads; medians of the rounds.
Mask application is ours in both cases (native/token_mask.c), so it is not part of this race.
Figures move by 20-50% on a busy machine: compare numbers from one run only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from switchyard.engine.backends.cpu.native import keep_workers_spinning

keep_workers_spinning()  # as `engine serve` does, before torch loads libgomp

import llguidance  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city", "unit", "days"]}
SEARCH = {"type": "object", "properties": {
    "query": {"type": "string"},
    "filters": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                          "maxItems": 4}, "after": {"type": "string"}},
                "required": ["tags"]},
    "limit": {"type": "integer", "minimum": 1, "maximum": 50}}, "required": ["query", "filters", "limit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search_docs", "description": "Search the docs", "parameters": SEARCH}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "hobbies": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "hobbies"]}
CALL = ('<tool_call>\n{"name": "search_docs", "arguments": {"query": "grammar masks", "filters": {"tags": '
        '["cpu", "llm"], "after": "2024"}, "limit": 5}}\n</tool_call>')
TEXTS = {"required": CALL, "auto": "Let me look that up for you.\n" + CALL,
         "json": '{"name": "Ada Lovelace", "age": 36, "hobbies": ["maths", "poetry", "engines"]}'}
BODIES = {"required": {"tool_choice": "required", "parallel_tool_calls": False}, "auto": {},
          "json": {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}}


def _tokenizer(path: Path) -> Any:
    from switchyard.engine.chat import tokenizer
    from switchyard.engine.model.gguf_file import GGUFFile

    return tokenizer.from_gguf(GGUFFile(path))


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.3f} ms"


# -- libraries ------------------------------------------------------------------------------------


def libraries(path: Path, rounds: int) -> None:
    from switchyard.engine.chat.structured import constraint

    tok = _tokenizer(path)
    V = tok.vocab_size
    seqs = {k: tok.encode(v) + [2] for k, v in TEXTS.items()}
    libs: dict[str, Any] = {}

    import llguidance
    import llguidance.torch

    t = time.perf_counter()
    ll = llguidance.LLTokenizer(tok.tok.to_str(), n_vocab=V, eos_token=sorted(tok.eos_ids))
    print(f"llguidance {llguidance.__version__}: tokenizer {(time.perf_counter() - t) * 1000:.0f} ms")
    tmpl = {}
    for kind, body in BODIES.items():
        c = constraint(body, None if kind == "json" else TOOLS)
        assert c is not None
        t0 = time.perf_counter()
        m = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(c.grammar))
        t1 = time.perf_counter()
        m.deep_copy()
        t2 = time.perf_counter()
        assert not m.is_error(), m.get_error()
        tmpl[kind] = m
        print(f"  compile {kind:8s}: first {(t1 - t0) * 1000:.2f} ms, cached (a copy) {(t2 - t1) * 1000:.3f} ms")
    ex = llguidance.LLExecutor(2)
    libs["llguidance"] = (lambda k: tmpl[k].deep_copy(),
                          lambda ms, bm: llguidance.torch.fill_next_token_bitmask_par(
                              ex, [(m, i) for i, m in enumerate(ms)], bm),
                          lambda m, t: m.consume_token(t))
    try:
        import xgrammar as xgr
    except ImportError:
        print("xgrammar not installed: `pip install xgrammar` to compare")
    else:
        t = time.perf_counter()
        enc = [""] * V
        for s, i in tok.tok.get_vocab(with_added_tokens=True).items():
            enc[i] = s
        info = xgr.TokenizerInfo(enc, xgr.VocabType.BYTE_LEVEL, vocab_size=V, stop_token_ids=sorted(tok.eos_ids))
        print(f"xgrammar {xgr.__version__}: tokenizer {(time.perf_counter() - t) * 1000:.0f} ms")

        def tags() -> list[dict[str, Any]]:
            return [{"type": "tag", "begin": '<tool_call>\n{"name": ' + json.dumps(t["function"]["name"]) + ', "arguments": ',
                     "content": {"type": "json_schema", "json_schema": t["function"]["parameters"]},
                     "end": "}\n</tool_call>"} for t in TOOLS]

        st = {"required": {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": tags(), "at_least_one": True,
                           "stop_after_first": True},
              "auto": {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": tags()}}
        xc = {}
        for kind in BODIES:
            comp = xgr.GrammarCompiler(info, max_threads=2)

            def build(kind: str = kind, comp: Any = comp) -> Any:
                if kind == "json":
                    return comp.compile_json_schema(PERSON, any_whitespace=False)
                return comp.compile_structural_tag(json.dumps({"type": "structural_tag", "format": st[kind]}))

            t0 = time.perf_counter()
            xc[kind] = build()
            t1 = time.perf_counter()
            build()
            t2 = time.perf_counter()
            print(f"  compile {kind:8s}: first {(t1 - t0) * 1000:.2f} ms, cached {(t2 - t1) * 1000:.3f} ms")
        bx = xgr.BatchGrammarMatcher(2)
        libs["xgrammar"] = (lambda k: xgr.GrammarMatcher(xc[k]),
                            lambda ms, bm: bx.batch_fill_next_token_bitmask(ms, bm),
                            lambda m, t: m.accept_token(t))
    res: dict[tuple[int, str, str], list[float]] = {}
    for _ in range(rounds):
        for B in (1, 16):
            for kind in ("required", "auto", "json", "mixed"):
                rows = [("required", "auto", "json")[i % 3] if kind == "mixed" else kind for i in range(B)]
                for name, (new, fill, accept) in libs.items():  # alternate, round by round
                    ms = [new(k) for k in rows]
                    bm = torch.full((B, (V + 31) // 32), -1, dtype=torch.int32)
                    n = min(len(seqs[k]) for k in rows) - 1
                    spent = 0.0
                    for s in range(n):
                        t0 = time.perf_counter()
                        fill(ms, bm)
                        spent += time.perf_counter() - t0
                        for m, k in zip(ms, rows, strict=True):
                            assert accept(m, seqs[k][s]), (name, k, s)
                    res.setdefault((B, kind, name), []).append(spent / n)
    print("\nmask fill per step (median of rounds; kinds: tool calls required, auto = free text then a call, "
          "a JSON schema, and the three mixed in one batch)")
    for (B, kind, name), v in sorted(res.items()):
        print(f"  batch {B:2d} {kind:8s} {name:10s} {_ms(v)}  (rounds {min(v) * 1000:.3f}-{max(v) * 1000:.3f})")


# -- slices ------------------------------------------------------------------------------------------


def slices(path: Path, rounds: int, steps: int) -> None:
    """A row's fill under llguidance's general slices, under ours (chat/grammar.SLICES) and under BY_LENGTH
    (ours with a slice per token length, engine_cuda_grammar), over the same random walks (each step a token
    drawn from the allowed ones, as random weights pick), the masks compared bit for bit at every step."""
    import random

    import numpy as np

    from switchyard.engine.chat.grammar import SLICES, ll_tokenizer
    from switchyard.engine.chat.structured import constraint

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from engine_cuda_grammar import BY_LENGTH, GRAMMAR_SCHEMA  # the GPU bench's items: strings under patterns

    tok = _tokenizer(path)
    V, W = tok.vocab_size, (tok.vocab_size + 31) // 32
    schema = {"type": "json_schema", "json_schema": {"name": "items", "schema": GRAMMAR_SCHEMA}}
    grammars = {"tool calls": constraint(BODIES["required"], TOOLS), "auto": constraint(BODIES["auto"], TOOLS),
                "json": constraint(BODIES["json"], None), "items": constraint({"response_format": schema}, None)}
    toks = {}
    for name, sl in (("general", llguidance.LLTokenizer.general_slices()), ("ours", SLICES), ("lengths", BY_LENGTH)):
        t = time.perf_counter()
        toks[name] = ll_tokenizer(tok.tok.to_str(), V, sorted(tok.eos_ids), sl)
        print(f"tokenizer with the {name} slices ({len(sl)}): {(time.perf_counter() - t) * 1000:.0f} ms")
    print(f"\na row's fill, {rounds} random walks of {steps} steps a grammar (a finished reply starts again)")
    for gname, c in grammars.items():
        assert c is not None
        tmpl = {k: llguidance.LLMatcher(t, llguidance.LLMatcher.grammar_from_lark(c.grammar), log_level=0)
                for k, t in toks.items()}
        spent: dict[str, list[float]] = {k: [] for k in toks}
        for seed in range(rounds):
            rng, ms = random.Random(seed), {k: m.deep_copy() for k, m in tmpl.items()}
            bms = {k: np.zeros(W, dtype=np.int32) for k in toks}
            for _ in range(steps):
                for k, m in ms.items():
                    if m.is_stopped():
                        m.reset()
                    t0 = time.perf_counter()
                    m.unsafe_compute_mask_ptr(bms[k].ctypes.data, W * 4)
                    spent[k].append(time.perf_counter() - t0)
                assert all(np.array_equal(bms["general"], b) for b in bms.values()), f"{gname}: slices changed a mask"
                allowed = np.flatnonzero(np.unpackbits(bms["ours"].view(np.uint8), bitorder="little")[:V])
                x = int(allowed[rng.randrange(len(allowed))])
                for m in ms.values():
                    assert m.consume_token(x)
        for k, v in spent.items():
            v.sort()
            print(f"  {gname:10s} {k:8s} mean {statistics.fmean(v) * 1e6:5.0f} us  p50 {v[len(v) // 2] * 1e6:4.0f}"
                  f"  p90 {v[int(len(v) * 0.9)] * 1e6:4.0f}  p99 {v[int(len(v) * 0.99)] * 1e6:4.0f}"
                  f"  max {v[-1] * 1e6:5.0f} us")


# -- engine ------------------------------------------------------------------------------------------


def engine(path: Path, rounds: int, steps: int, threads: int, mask_threads: int) -> None:
    from switchyard.engine.chat.grammar import GrammarMasker, Grammars
    from switchyard.engine.chat.structured import constraint
    from switchyard.engine.core.sampling import SamplingParams, sample
    from switchyard.engine.model.step import Step
    from switchyard.engine.runner.model_runner import Runner
    from switchyard.engine.runner.options import EngineOptions

    tok = _tokenizer(path)
    runner = Runner(EngineOptions(model_path=path, tp=1, max_num_seqs=16, max_model_len=1024, threads=threads,
                                  collective="ring"), 0, 1)
    runner.setup()
    assert runner.config is not None
    t = time.perf_counter()
    grammars = Grammars(tok.tok.to_str(), runner.config.vocab_size, sorted(tok.eos_ids))
    print(f"engine: dtype {runner.dtype}, {runner.big_threads} threads; grammar tokenizer "
          f"{(time.perf_counter() - t) * 1000:.0f} ms")
    for kind, body in BODIES.items():
        c = constraint(body, None if kind == "json" else TOOLS)
        assert c is not None
        t0 = time.perf_counter()
        grammars.compile(c)
        t1 = time.perf_counter()
        grammars.compile(c)
        t2 = time.perf_counter()
        print(f"  Grammars.compile {kind:8s}: first {(t1 - t0) * 1000:.2f} ms, cached {(t2 - t1) * 1000:.3f} ms")
    req = constraint(BODIES["required"], TOOLS)
    assert req is not None
    masker = GrammarMasker(runner.config.vocab_size, threads=mask_threads)
    greedy = SamplingParams(temperature=0.0)
    prompt = tok.encode(tok.render([{"role": "user", "content": "Find the docs about grammar masks."}], TOOLS))
    for _ in range(rounds):
        for B in (1, 16):
            ctx = []
            for i in range(B):  # prefill each prompt into its slot
                n = len(prompt)
                runner.step(Step(torch.tensor([prompt]), torch.arange(n).unsqueeze(0), torch.tensor([i]),
                            torch.tensor([n]), torch.tensor([n]), 0))
                ctx.append(n)
            states = [grammars.compile(req) for _ in range(B)]
            last = [prompt[-1]] * B
            step_t, mask_t, fill_t = [], [], []
            for _ in range(steps):
                t0 = time.perf_counter()
                logits = runner.step(Step(torch.tensor(last).unsqueeze(1), torch.tensor(ctx).unsqueeze(1) - 1,
                                     torch.arange(B), torch.ones(B, dtype=torch.int64), torch.tensor(ctx), B))
                t1 = time.perf_counter()
                masker.apply(logits, list(states))
                t2 = time.perf_counter()
                fill_t.append(masker.last_fill_s)
                toks = sample(logits, [greedy] * B, [None] * B)
                t3 = time.perf_counter()
                for i, g in enumerate(states):
                    g.accept(toks[i])
                    if g.done:  # a finished call: a fresh one, so every row stays constrained
                        states[i] = grammars.compile(req)
                t4 = time.perf_counter()
                step_t.append(t1 - t0 + t3 - t2)  # the forward and the sampler: a step without grammars
                mask_t.append(t2 - t1 + t4 - t3)
                last = toks
                ctx = [c + 1 for c in ctx]
            ratio = statistics.median(mask_t) / statistics.median(step_t)
            print(f"  batch {B:2d}: decode step {_ms(step_t)}, masks + accept {_ms(mask_t)} "
                  f"({ratio:.1%} of the step; p90 {sorted(mask_t)[int(0.9 * len(mask_t))] * 1000:.3f} ms; "
                  f"of which llguidance's fill {_ms(fill_t)})")


# -- handover ---------------------------------------------------------------------------------------


def handover(path: Path, rounds: int, steps: int, turn_ms: float, rows: int = 16, row_us: float = 10) -> None:
    """The fill process's early tokens (ProcessMasker.EARLY) against the tokens handed over with the next
    step's rows: a step's time from its tokens read to the next masks filled (the process's ticket back),
    with the engine's turn in between (the real accepts, then a spin to `turn_ms`: the streaming and the
    next launch a GPU replica's engine does there). The masking kernel is left out (its wait only, on the
    host): what moves is when the fill starts. Also the engine's accepts a step (each row's accept and
    `done`, as the output stage takes them, each after `row_us` of the row's other work, its streaming: ~13 us
    a row in the H100 hosts' split, gpu_fill_lanes call 1): with early tokens the mirrors take them and `done`
    reads their word. The GPU bench's grammars (bench/engine_cuda_grammar.grammar_factory: its items, and tool
    calls whose finished call starts another); each row's token drawn from its mask."""
    import random

    import numpy as np

    from switchyard.engine.chat import grammar_process
    from switchyard.engine.chat.grammar_process import ProcessMasker

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from engine_cuda_grammar import grammar_factory

    def wait_only(logits: Any, bm: Any, rows: list[int], wait: tuple[torch.Tensor, int]) -> None:
        while wait[0][0] < wait[1]:
            pass

    real_mask, grammar_process.fused_mask = grammar_process.fused_mask, lambda: wait_only  # type: ignore[assignment]
    tok = _tokenizer(path)
    V = tok.vocab_size
    makes = {"items": grammar_factory(tok, lanes=1), "tool calls": grammar_factory(tok, tool_calls=True, lanes=1)}
    print(f"{rows} rows, {steps} steps a round, the engine's turn {turn_ms} ms ({row_us} us a row before its accept), "
          f"{rounds} alternated rounds; "
          f"from a step's tokens read to the next masks filled (median of the steps, then of the rounds):")
    try:
        for name, make in makes.items():
            took: dict[bool, list[float]] = {True: [], False: []}
            accepts: dict[bool, list[float]] = {True: [], False: []}
            for r in range(rounds):
                for early in (True, False):
                    proc = ProcessMasker(V, tok.tok.to_str(), sorted(tok.eos_ids), threads=1, lanes=1, max_rows=rows,
                                         pinned=False)
                    proc.EARLY = early
                    rng, states, lat, acc = random.Random(r), [make() for _ in range(rows)], [], []
                    try:
                        proc.apply(torch.empty(rows, 1), states)  # type: ignore[arg-type]
                        proc.wait()
                        for _ in range(steps):
                            bits = np.unpackbits(proc.bitmasks[proc.ticket & 1][:rows].numpy().view(np.uint8), axis=1,
                                                 bitorder="little")[:, :V]
                            tokens = [int(rng.choice(np.flatnonzero(b))) for b in bits]
                            t0 = time.perf_counter()
                            if proc.EARLY:  # as the output stage asks it
                                proc.early(states, tokens)
                            took_accepts = 0.0
                            for s, t in zip(states, tokens, strict=True):
                                t1 = time.perf_counter()
                                while time.perf_counter() - t1 < row_us * 1e-6:
                                    pass
                                t1 = time.perf_counter()
                                s.accept(t)
                                s.done  # noqa: B018  # the output stage asks each row
                                took_accepts += time.perf_counter() - t1
                            acc.append(took_accepts)
                            while time.perf_counter() - t0 < turn_ms / 1000:
                                pass
                            proc.apply(torch.empty(rows, 1), states)  # type: ignore[arg-type]
                            lat.append(time.perf_counter() - t0)
                    finally:
                        proc.close()
                    took[early].append(statistics.median(lat))
                    accepts[early].append(statistics.median(acc))
            for early in (True, False):
                label = "early tokens" if early else "tokens with the next rows"
                print(f"  {name:10s} {label:26s} {_ms(took[early])}  (rounds: "
                      + ", ".join(f"{t * 1000:.3f}" for t in took[early]) + f"); the engine's accepts {_ms(accepts[early])}")
    finally:
        grammar_process.fused_mask = real_mask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["both", "engine", "libraries", "slices", "handover"], default="both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=48, help="decode steps per round (engine part)")
    ap.add_argument("--threads", type=int, default=0, help="the runner's threads (0: all cores)")
    ap.add_argument("--mask-threads", type=int, default=1, help="llguidance's threads for a step's masks")
    ap.add_argument("--turn-ms", type=float, default=0.3, help="handover part: the engine's turn a step")
    args = ap.parse_args()
    from switchyard.engine.serving import registry

    path = registry.pull("smollm2-135m")
    if args.part == "slices":
        slices(path, args.rounds, args.steps * 4)
    if args.part == "handover":
        handover(path, args.rounds, args.steps, args.turn_ms)
    if args.part in ("both", "libraries"):
        libraries(path, args.rounds)
    if args.part in ("both", "engine"):
        engine(path, args.rounds, args.steps, args.threads, args.mask_threads)


if __name__ == "__main__":
    main()
