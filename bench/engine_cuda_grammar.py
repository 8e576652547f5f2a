"""bench/engine_cuda.py's grammar rounds: the grammars every row decodes under (GRAMMAR_SCHEMA's items, a
tool call's), the factories of each row's state, the variants of the fill (--grammar-ab) and the rounds that
alternate them with free decoding at one batch (--grammar-rounds). bench/grammar.py and
bench/grammar_parts.py take the same grammars from here."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import llguidance

if TYPE_CHECKING:
    from switchyard.engine.model.decoder import Decoder

# Every row's grammar under --grammar-batches: a JSON object holding an array of at least 40
# objects (keys, strings under a pattern, integers, nested arrays), so no row can finish early.
_ITEM = {"type": "object", "properties": {
    "name": {"type": "string", "pattern": "^[a-z ]{4,24}$"},
    "count": {"type": "integer", "minimum": 0, "maximum": 999},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,12}$"}, "maxItems": 3}},
    "required": ["name", "count", "tags"]}
# chat/grammar.SLICES with its digits' and lower-case words' classes one slice per token length rather than in
# spans (tried 2026-12-07: a lower mean row fill on a Zen 4, worse tails on the H100 hosts' Xeons; the ab's
# "by-length slices", bench/grammar.py --part slices, grammar_fill_threads.py --slices).
_GENERAL = llguidance.LLTokenizer.general_slices()
_SPANS = {"[A-Za-z ]": ((1, 4), (5, 8)), "[A-Za-z0-9_ ]": ((1, 4), (5, 8))}
BY_LENGTH = (_GENERAL[:1] + [f"{c}{{{n}}}" for c, top in {"[0-9]": 8, "[a-z]": 16, "[a-z ]": 16}.items()
                             for n in range(1, top + 1)]
             + [f"{c}{{{lo},{hi}}}" for c, spans in _SPANS.items() for lo, hi in spans] + _GENERAL[1:])
# engine_cuda.decode_rate's thread and the fill process pinned for a decode (Scheduler.pin, as a served loop
# under --pin-cpus on): the ab's pinned variants and free decoding beside them.
PIN_ENGINE = False
# engine_cuda.decode_rate under a grammar: a batch of it first, untimed, through the same scheduler (the ab's warm ones):
# a served fill process has filled earlier requests of a schema, and each of its lanes' lexers warms alone, where
# every decode of the bench starts a fill process cold (16 rows, a compilation each, 120 steps on a 2-core Xeon,
# bench/grammar_fill_threads.py --warmup: items 0.71 ms a step fresh, 0.64 from the same compilations again; tool
# calls 0.10 and 0.06).
WARM_GRAMMAR = False
GRAMMAR_SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": _ITEM, "minItems": 40}},
                  "required": ["items"]}


def grammar_constraint(tool_calls: bool = False) -> Any:
    """GRAMMAR_SCHEMA's constraint, or with tool_calls a `tool_choice: required` call of
    bench/grammar.py's two tools (plain strings, where llguidance's slices apply; under
    grammar_factory a row whose call is complete starts another)."""
    from switchyard.engine.chat.structured import constraint

    if tool_calls:
        from grammar import BODIES, TOOLS

        c = constraint(BODIES["required"], TOOLS)
    else:
        c = constraint({"response_format": {"type": "json_schema",
                                            "json_schema": {"name": "items", "schema": GRAMMAR_SCHEMA}}}, None)
    assert c is not None
    return c


def grammar_factory(tok: Any, tool_calls: bool = False, lanes: int | None = None,
                    slices: list[str] | None = None) -> Any:
    """A fresh matcher per call of grammar_constraint(tool_calls)'s grammar, compiled once per lane
    (chat/grammar.Grammars; None: a GPU replica's lanes, as served) against a tokenizer with `slices`
    (None: chat/grammar.SLICES, as served). A tool call's row starts
    another call when one is complete (its matcher reset, as bench/grammar_fill_threads.py's
    streams do), so that no row finishes early and a batch stays whole to the end."""
    from switchyard.engine.chat.grammar import Grammars, GrammarState
    from switchyard.engine.runner.options import auto_grammar_threads, grammar_lanes

    class EndlessCalls(GrammarState):
        def accept(self, token: int) -> None:
            super().accept(token)
            if not self.failed and self.done:
                self.reset()

    g = Grammars(tok.tok.to_str(), tok.vocab_size, sorted(tok.eos_ids),
                 lanes=lanes or grammar_lanes(auto_grammar_threads("cuda")), slices=slices)
    c = grammar_constraint(tool_calls)
    if not tool_calls:
        return lambda: g.compile(c)

    def endless() -> GrammarState:
        s = g.compile(c)
        return EndlessCalls(s.matcher, vocab_size=s.vocab_size, lane=s.lane, grammar=s.grammar)
    return endless


def _knob(module: str, owner: str | None, attr: str, value: Any) -> tuple[Any, str, Any]:
    """(holder, attribute, value): a module's or a class's knob, set for one decode."""
    import importlib

    m = importlib.import_module(module)
    return (getattr(m, owner) if owner else m, attr, value)


def grammar_variants(switches_us: tuple[int, ...] = ()) -> dict[str, tuple[bool, list[tuple[Any, str, Any]]]]:
    """--grammar-ab's variants of the loop, by name: (under the grammar or free, the knobs set for one decode).

    - the masks filled the other way than the tree's GrammarMasker.AHEAD (in line on the engine's thread, or
      ahead on the masker's), and on the fill thread;
    - the served fill process with the step's tokens handed over with the next step's rows and taken by the
      engine's matchers too (ProcessMasker.EARLY off);
    - the process filling its rows one after another or over a pool of 16 threads rather than the served 8
      (ProcessMasker.THREADS);
    - the engine's thread and the process on cores of their own (PIN_ENGINE: Scheduler.pin, --pin-cpus on);
    - the process's mirrors copied from one compilation a grammar rather than one a lane (ProcessMasker.LANES;
      one row after another, as a pool on one lexer would wait on its lock);
    - after an untimed batch of the same grammar through the same scheduler (WARM_GRAMMAR: the fill process's
      lexers warm, as a served replica's are).

    (Until 2026-12-07 also by 2 and 4 fill processes, each filling its rows one after another:
    bench/results/gpu_fill_lanes, calls 18-19. Until 2026-12-06 also torch's masking ops and the sampling
    stage's host cuts undone, bench/results/gpu_host_cuts; until the masks filled ahead were served, a 10 us
    GIL switch interval for them, which lost: bench/results/gpu_grammar_ahead.)
    switches_us: also the fill thread under each of these GIL switch intervals (GrammarMasker.SWITCH_S,
    set for the process when a decode's fill thread starts)."""
    from switchyard.engine.chat.grammar import GrammarMasker

    served = GrammarMasker.AHEAD
    other = _knob("switchyard.engine.chat.grammar", "GrammarMasker", "AHEAD", not served)
    # The fill on a thread, ahead and the other way (the served fill, --grammar-fill auto, is a process on a GPU).
    thread = _knob("switchyard.engine.core.output", "OutputStage", "FILL_PROCESS", False)
    late = _knob("switchyard.engine.chat.grammar_process", "ProcessMasker", "EARLY", False)
    serial, wide = (_knob("switchyard.engine.chat.grammar_process", "ProcessMasker", "THREADS", n) for n in (1, 16))
    pinned = _knob("engine_cuda_grammar", None, "PIN_ENGINE", True)  # --pin-cpus on, as free's below
    one_lane = _knob("switchyard.engine.chat.grammar_process", "ProcessMasker", "LANES", 1)
    warm = _knob("engine_cuda_grammar", None, "WARM_GRAMMAR", True)
    out = {"grammar, in line" if served else "grammar, filled ahead": (True, [other, thread]),
           "grammar, fill thread": (True, [thread]),
           "grammar, process, tokens after the host's turn": (True, [late]),
           "grammar, process, serial fill": (True, [serial]), "grammar, process, 16 fill threads": (True, [wide]),
           "grammar, process, pinned": (True, [pinned]),
           "grammar, process, serial fill, pinned": (True, [serial, pinned]),
           "grammar, process, one lane": (True, [one_lane, serial]),
           "grammar, process, one lane, pinned": (True, [one_lane, serial, pinned]),
           "grammar, warm": (True, [warm]), "grammar, warm, pinned": (True, [warm, pinned])}
    for us in switches_us:  # the fill thread's
        out[f"grammar, {us} us switch"] = (True, [thread, _knob("switchyard.engine.chat.grammar", "GrammarMasker",
                                                                "SWITCH_S", us * 1e-6)])
    return out


def grammar_rounds(rate: Callable[..., dict[str, float]], m: Decoder, b: int, make: Any, rounds: int, ab: bool,
                   tokens: int, vocab: int, tok: Any, add: Callable[..., None], log: Callable[[str], None],
                   tool_calls: Any = None, pools: tuple[str, ...] = (), gtok: Any = None,
                   switches_us: tuple[int, ...] = (), only: tuple[str, ...] = ()) -> None:
    """Free and grammar decoding, each decode `rate`'s (engine_cuda.decode_rate: the served loop) (and with `ab` grammar_variants() and the masks filled by one thread;
    with `tool_calls`, a factory, the tool-call grammar; with `pools`, the masks filled by llguidance's
    pool: an entry T, of T threads, the rows' matchers copied from one compilation, and from one per
    thread; TxL, of T threads over L lanes (Grammars(lanes=L)); TxLt, the same under the tool-call grammar)
    alternated `rounds` times at batch b; each figure the median of its rounds, so a ratio compares
    neighbours in time rather than two points minutes apart. `only`: these variants alone (their names without
    "ours (async, " and ")"), beside free decoding."""
    runs: dict[str, list[dict[str, float]]] = {}
    engines: list[tuple[str, list[tuple[Any, str, Any]], Any, Any]] = [
        ("ours (async)", [], None, None), ("ours (async, grammar)", [], make, None)]
    if ab:  # free decoding with the engine's thread pinned, beside the pinned variants (their ratio's base)
        engines.append(("ours (async, pinned)", [_knob("engine_cuda_grammar", None, "PIN_ENGINE", True)], None, None))
        engines += [(f"ours (async, {k})", knobs, make if constrained else None, None)
                    for k, (constrained, knobs) in grammar_variants(switches_us).items()]
        engines.append(("ours (async, grammar, one fill thread)", [], grammar_factory(gtok, lanes=1), 1))
        # The served fill on BY_LENGTH, not on ours (chat/grammar.SLICES).
        engines.append(("ours (async, grammar, by-length slices)", [], grammar_factory(gtok, slices=BY_LENGTH), None))
    if tool_calls is not None:
        engines.append(("ours (async, grammar, tool calls)", [], tool_calls, None))
    if ab and tool_calls is not None:
        engines += [(f"ours (async, {k}, tool calls)", knobs, tool_calls, None)
                    for k, (_, knobs) in grammar_variants().items()
                    if k.startswith("grammar, fill") or k.endswith(("serial fill", "process, pinned", "warm"))]
    for pool in pools:
        threads, _, lanes = pool.partition("x")
        if not lanes:
            t = int(threads)
            engines.append((f"ours (async, grammar, pool of {t})", [], grammar_factory(gtok, lanes=1), t))
            engines.append((f"ours (async, grammar, pool of {t}, a grammar each)", [],
                            grammar_factory(gtok, lanes=t), t))
            continue
        tools = lanes.endswith("t")
        lanes = lanes.removesuffix("t")
        engines.append((f"ours (async, grammar, pool of {threads} over {lanes} lanes{', tool calls' if tools else ''})",
                        [], grammar_factory(gtok, tool_calls=tools, lanes=int(lanes)), int(threads)))
    if only:
        engines = [e for e in engines if e[2] is None or e[0].removeprefix("ours (async, ").removesuffix(")") in only]
    failed: set[str] = set()
    for i in range(rounds):
        for engine, knobs, grammar, threads in engines:
            if engine in failed:
                continue
            saved = [(h, k, getattr(h, k)) for h, k, _ in knobs]
            for h, k, v in knobs:
                setattr(h, k, v)
            try:
                r = rate(m, b, tokens, vocab, tok=tok, grammar=grammar, mask_threads=threads)
            except Exception as e:  # one variant's failure must not lose the other figures
                log(f"    round {i} b={b} {engine}: FAILED {type(e).__name__}: {str(e)[:200]}")
                failed.add(engine)
                continue
            finally:
                for h, k, v in saved:
                    setattr(h, k, v)
            runs.setdefault(engine, []).append(r)
            log(f"    round {i} b={b} {engine:44} {r['tok_s']:10.1f} tok/s  step {r['step_ms']:.3f} ms"
                + (f"  fill {r['mask_ms']:.3f} ms" if "mask_ms" in r else "")
                + (f"  ready {r['ready_ms']:.3f} ms" if "ready_ms" in r else "")
                + (f"  early: pickup {r['pickup_ms']:.3f} consume {r['consume_ms']:.3f} fill done to ticket "
                   f"{r['gap_ms']:.3f} ms" if "gap_ms" in r else ""))
    for engine, rs in runs.items():
        tok_s = statistics.median(r["tok_s"] for r in rs)
        each = ", ".join(f"{r['tok_s']:.0f}" for r in rs)
        note = f"step {statistics.median(r['step_ms'] for r in rs):.3f} ms, median of {len(rs)} rounds ({each})"
        if "mask_ms" in rs[0]:
            note += f", mask fill {statistics.median(r['mask_ms'] for r in rs):.3f} ms"
        add(engine, "decode_tok_s", b, tok_s, "tok/s", note)
