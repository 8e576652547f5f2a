"""Grammar-constrained decoding with llguidance: compiled grammars cached per grammar text, one
matcher per constrained sequence, and each step's token masks for a whole batch at once.

Why llguidance (bench/grammar.py, 2-core Zen 5, same grammars and token streams as xgrammar
0.2.9): a step's masks took 0.013-0.039 ms at batch 1 against xgrammar's 0.055-0.18 ms, and
0.13-0.81 ms at batch 16 against 0.36-0.70 ms (xgrammar was faster only on the free text of
`auto`); it needs no ahead-of-time compile (1-18 ms for a new grammar, 0.01 ms for a cached one,
a copy of its matcher) and brings no torch, triton or transformers dependency.

Threads: the HTTP side compiles (`Grammars.compile`, from a worker thread); the engine thread
owns the matchers (`GrammarState`) and the masker. Rank 0 alone masks: the other ranks never
see logits.
"""

from __future__ import annotations

import collections
import functools
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llguidance
import torch

from switchyard.engine.backends.cpu.token_mask import apply_token_bitmask
from switchyard.engine.chat.structured import Constraint
from switchyard.engine.errors import EngineFailed, GrammarError

RESET = -1  # a token in a row's `new`: its matcher was reset (GrammarState.reset; a fill process's mirror resets too)

BACKEND = f"llguidance {llguidance.__version__}" if hasattr(llguidance, "__version__") else "llguidance"

# llguidance's slices: sets of tokens whose whole mask is added at once wherever the grammar allows every
# token of the set, instead of walking their part of the token trie (a token belongs to the first slice it
# matches). Its general ones cover a JSON string's free text; a string under a pattern (`^[a-z ]{4,24}$`)
# walked ~33k of SmolLM2's tokens, 0.4-0.8 ms a row. These add the character classes of common patterns,
# lower-case words (with spaces), mixed case, identifiers, digits, in length spans so that a pattern with
# room left for a span takes it whole; the masks are the same bits. On SmolLM2's tokenizer (bench/grammar.py
# --part slices, a 2-core Zen 3) the items grammar's row fill fell from 84 to 59 us on average (its 90th
# percentile from 384 to 184 us), tool calls and plain JSON no slower; the tokenizer took 0.39 s, not 0.29.
# A slice per token length (bench/engine_cuda_grammar.BY_LENGTH) cut the mean further on a Zen 4 (40 -> 28 us)
# but not the costliest rows, and on the H100 hosts' Xeons its step sums and tails were worse (16 rows: p50 637
# against 595 us, the costliest row's p90 553 against 402) and batch 16 no faster (bench/results/gpu_fill_lanes,
# calls 14-17): the spans stay.
# Narrow classes first (a token is the first slice's that matches it); whitespace first, as in the general ones.
_GENERAL = llguidance.LLTokenizer.general_slices()
_CLASSES = {"[0-9]": 8, "[a-z]": 16, "[a-z ]": 16, "[A-Za-z ]": 8, "[A-Za-z0-9_ ]": 8}  # class: its longest span
SLICES = _GENERAL[:1] + [f"{c}{{{lo},{hi}}}" for c, top in _CLASSES.items()
                         for lo, hi in ((1, 4), (5, 8), (9, 16)) if hi <= top] + _GENERAL[1:]


def ll_tokenizer(tokenizer_json: str, vocab_size: int, eos_ids: list[int],
                 slices: list[str] | None = None) -> llguidance.LLTokenizer:
    """llguidance's tokenizer with SLICES (None) or the `slices` given; ~0.4-0.7 s for a 49k vocabulary."""
    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_ids,
                                  slices=SLICES if slices is None else slices)


class Grammars:
    """Compiles constraints for one tokenizer and keeps the last `cache_size` of them per lane.

    A compiled grammar is a matcher in its start state; each request gets a copy (~10 us). Copies
    of one compiled grammar share its lexer, so a pool filling their masks contends on it (2
    threads: 0.95-1.06x the in-line fill, bench/results/grammar_fill_threads.md). `lanes`: each
    grammar compiled once per lane, on the first request dealt to that lane (requests go to the
    lanes in turn), so that the masker's `threads` fill rows that share no lexer (GrammarMasker
    sorts a step's rows by lane). With the fill on the masker's own thread (filled ahead), a pool
    of 8 with 8 lanes ran SmolLM2's shape at batch 16 under the items grammar 1.80x as fast as one
    fill thread (bench/results/gpu_step_cuts, call 2), and over 16 lanes (a GPU replica's,
    runner/options.fill_lanes: a lane for each row of a batch of 16) 1.13-1.17x as fast again
    (bench/results/gpu_fill_lanes, two calls); filled in line, on the engine's thread, the lanes had lost
    (bench/results/gpu_grammar_lanes).
    """

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int], cache_size: int = 256,
                 lanes: int = 1, slices: list[str] | None = None) -> None:
        self.tok = ll_tokenizer(tokenizer_json, vocab_size, eos_ids, slices)  # once per server, at start-up
        self.vocab_size = vocab_size
        self.lanes = lanes
        self.cache_size = cache_size * lanes
        self._cache: collections.OrderedDict[tuple[str, int], llguidance.LLMatcher] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._dealt = 0  # requests dealt to the lanes so far
        self.compiled = 0  # cache misses, for /health

    def compile(self, c: Constraint) -> GrammarState:
        with self._lock:
            lane, self._dealt = self._dealt % self.lanes, self._dealt + 1
            key = (c.key, lane)
            tmpl = self._cache.get(key)
            if tmpl is not None:
                self._cache.move_to_end(key)
        if tmpl is None:
            tmpl = llguidance.LLMatcher(self.tok, llguidance.LLMatcher.grammar_from_lark(c.grammar), log_level=0)
            if tmpl.is_error():
                raise self._blame(c, tmpl.get_error())
            with self._lock:
                self.compiled += 1
                self._cache[key] = tmpl
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return GrammarState(tmpl.deep_copy(), vocab_size=self.vocab_size, lane=lane, grammar=c.grammar)

    def _blame(self, c: Constraint, error: str) -> GrammarError:
        """The error, with the parameter whose schema causes it (each is compiled alone)."""
        for part in c.parts:
            g = llguidance.LLMatcher.grammar_from_json_schema(part.schema)
            bad, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(g, self.tok)
            if bad:
                return GrammarError(f"{part.param} is not a JSON Schema the grammar engine can compile: "
                                    f"{msgs[0] if msgs else error}", part.param)
        return GrammarError(f"the request's structured-output grammar does not compile: {error}",
                            c.parts[0].param if c.parts else None)

    def info(self) -> dict[str, Any]:
        with self._lock:
            cached = len({key for key, _ in self._cache})
        return {"backend": BACKEND, "cached_grammars": cached, "compiled": self.compiled, "lanes": self.lanes}


@dataclass
class GrammarState:
    """One sequence's matcher. `done`: the grammar allows nothing more (the reply is complete);
    `failed`: a token it did not allow was accepted (cannot happen while its mask is applied)."""

    matcher: llguidance.LLMatcher
    failed: bool = False
    vocab_size: int = 0  # the tokenizer's vocabulary the matcher masks (0: the logits' width)
    lane: int = 0  # which of Grammars' compilations it was copied from
    grammar: str = ""  # the lark text it was compiled from (a fill process compiles its mirror from it)
    slot: int = -1  # its mirror's slot in a fill process (chat/grammar_process), once masked there
    new: list[int] | None = None  # with a fill process: the tokens accepted since its last step there
    sent: int = 0  # ... of which the first `sent` reached it early, before they were accepted (ProcessMasker.early)
    # Its token went early: (the masker, its early row), where the mirror says whether that token ended the
    # reply. The engine's matcher does not take such tokens (the mirror's accept was the second of each).
    mirror: tuple[Any, int] | None = None

    def accept(self, token: int) -> None:
        if self.mirror is not None:
            if not self.sent or self.new:  # a token the mirror did not get early: this matcher is behind it
                raise EngineFailed("a constrained row's token did not reach its fill process early")
        elif not self.failed and not self.matcher.consume_token(token):
            self.failed = True
        if self.new is not None:
            self.new.append(token)

    @property
    def done(self) -> bool:
        if self.failed:
            return True
        if self.mirror is not None:
            masker, row = self.mirror
            return masker.mirror_done(self, row)
        return self.matcher.is_stopped()

    def reset(self) -> None:
        """Start the grammar over (a bench's tool-call row starting its next call); a fill process's
        mirror resets with the row's next step."""
        self.matcher.reset()
        self.mirror = None
        if self.new is not None:
            self.new.append(RESET)


class GrammarMasker:
    """Each step's token masks for the constrained rows of a batch, applied to its logits in one
    call: rows without a grammar keep their logits untouched. The masks are as wide as the
    grammars' tokenizer (`vocab_size`); logits wider than that (a model whose vocabulary is
    padded) never allow the padding.

    The bitmask is filled by llguidance on the host: row after row (threads=1), or, with at least
    PAR_ROWS constrained rows, by its executor's pool of `threads`, the rows sorted by their
    grammar's lane (Grammars: the pool runs on the masker's thread, filled ahead, and wins only
    when each thread's rows have a compilation of their own; a GPU replica's default,
    runner/options.auto_grammar_threads). GPU logits get their masks without the host waiting
    for the device: llguidance writes straight into pinned memory (two buffers, used in turn, so
    a step's fill never overwrites bits still being read) and the masking is queued (one Triton
    kernel, backends/cuda/token_mask.py; torch's ops where triton is missing).

    Ahead (served for GPU logits, AHEAD; `ahead=True` for any): the fill runs on the masker's own
    thread while the engine's thread goes on: the masking kernel is queued at once and waits on
    the GPU for the fill's ticket (a pinned word the thread writes last), then the sampling and the
    next step are queued behind it, so the host's turn loses llguidance's time (at SmolLM2's size
    and batch 1 a fifth of the GPU's step; at batch 16, longer than the step). The matchers are the
    fill thread's until `wait()` (the output stage calls it before it accepts the step's tokens). A
    thread gets the GIL back from a busy engine thread only when that one blocks or its switch
    interval runs out (5 ms by default, longer than a step): the masker sets the process's
    interval to SWITCH_S when it starts its thread. On an H100 (bench/results/gpu_grammar_ahead,
    call 5) this form, one program polling the word, ran SmolLM2's shape under the items grammar
    1.11x (batch 1) and 1.37x (batch 16) as fast as the in-line fill, and the 8B's as fast; four
    earlier forms lost (the GPU saw the host's word milliseconds late through volatile loads, and
    every masking program polling it at system scope cost ~5 us each), as did filling on a thread
    while the host waited for it before queueing the masks (bench/results/gpu_grammar2)."""

    WHERE = "thread"  # where the masks fill, as /health says it (the masker's thread, or in line)
    EARLY = False  # a step's tokens handed to early() as the host reads them (a fill process's; the output stage asks)
    PAR_ROWS = 4  # fewer constrained rows than this fill in line even with a pool
    FUSED = True  # GPU logits masked by the Triton kernel where triton loads (False: torch's ops)
    AHEAD = True  # GPU logits: filled on the masker's thread, waited for on the GPU (False: in line)
    SWITCH_S = 1e-4  # the GIL's switch interval once a fill thread runs (Python's default: 5 ms)

    def __init__(self, vocab_size: int, threads: int = 1, ahead: bool | None = None) -> None:
        """ahead: fill on a thread of the masker's own (None: for GPU logits when AHEAD and the
        Triton kernel loads; True: for any logits, the kernel interpreted on CPU ones)."""
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.executor = llguidance.LLExecutor(threads) if threads > 1 else None
        self.ahead = ahead
        self._pinned = False  # whether the buffers are pinned (for GPU logits)
        self._buffers = [torch.full((0, self.words), -1, dtype=torch.int32)] * 2
        self._turn = 0
        self.last_fill_s = 0.0  # the last step's llguidance time (bench/grammar.py reads it)
        self.last_ready_s = 0.0  # filled ahead: the last step's time from its submission to its ticket
        self._filler: _Filler | None = None  # made on the first step filled ahead

    def _buffer(self, rows: int, pinned: bool) -> torch.Tensor:
        if pinned != self._pinned:
            self._pinned, self._buffers = pinned, [self._buffers[0][:0]] * 2
        self._turn ^= 1
        bm = self._buffers[self._turn]
        if bm.shape[0] < rows:
            bm = self._buffers[self._turn] = torch.full((rows, self.words), -1, dtype=torch.int32, pin_memory=pinned)
        return bm[:rows]

    def apply(self, logits: torch.Tensor, states: list[GrammarState | None]) -> None:
        """Mask `logits` [B, V >= vocab_size] in place; states[i] constrains row i (None: free).
        Filled ahead, the masks may not exist yet on return: the masking is queued on the
        device, and the matchers are not to be touched before `wait()`."""
        self.wait()
        live = [(i, s) for i, s in enumerate(states) if s is not None]
        if not live:
            return
        rows = [i for i, _ in live]
        if self.executor is not None:  # the pool splits the rows into runs: one lane's rows run together
            live.sort(key=lambda row: row[1].lane)
        todo = [(s.matcher, i) for i, s in live]
        cuda = logits.device.type == "cuda"
        fused = fused_mask() if self.FUSED and (cuda or self.ahead) else None
        ahead = fused is not None and (self.ahead if self.ahead is not None else self.AHEAD and cuda)
        bm = self._buffer(len(states), cuda)
        if ahead:
            if self._filler is None:
                self._filler = _Filler(self, cuda)
            ticket = self._filler.submit(todo, bm)  # before the kernel: whatever follows, the ticket comes
            fused(logits, bm, rows, (self._filler.flag, ticket))  # type: ignore[call-arg]
            return
        self.last_fill_s = self._fill(todo, bm)
        (fused or apply_token_bitmask)(logits, bm, rows)

    def _fill(self, todo: list[tuple[llguidance.LLMatcher, int]], bm: torch.Tensor) -> float:
        """llguidance writes each (matcher, row)'s mask into bm's row; returns the seconds taken."""
        t0 = time.perf_counter()
        if self.executor is not None and len(todo) >= self.PAR_ROWS:
            # What llguidance.torch.fill_next_token_bitmask_par does, without importing that module: its
            # @torch.compile decorator imports torch._dynamo, ~1.5 s of every engine process's start.
            self.executor.unsafe_compute_mask_ptr(todo, bm.data_ptr(), self.words * 4, bm.shape[0])
        else:
            row_bytes, base = self.words * 4, bm.data_ptr()
            for m, i in todo:
                m.unsafe_compute_mask_ptr(base + i * row_bytes, row_bytes)
        return time.perf_counter() - t0

    def wait(self) -> None:
        """Until the step filled ahead is filled (its matchers free again); raises what the fill
        raised, or EngineFailed if the GPU gave up waiting for it (its rows masked by whatever bits were there)."""
        if self._filler is not None:
            self._filler.join()

    def early(self, states: list[GrammarState | None], tokens: list[int]) -> None:
        """A step's sampled tokens as soon as the host has read them, before the output stage accepts
        them (states[i] None: a free or finished row): a fill process starts the next step's masks
        from them (ProcessMasker); the engine's own matchers fill nothing before their accept."""

    def close(self) -> None:
        """Nothing to free: the fill thread is a daemon, its buffers torch's (ProcessMasker's are not)."""


class _Filler:
    """The masker's fill thread: one step's rows at a time, each step's ticket written to the
    pinned flag[0] when its bits are all in place (flag[1]: the ticket of a wait the GPU gave up)."""

    def __init__(self, masker: GrammarMasker, pinned: bool) -> None:
        self.masker = masker
        self.flag = torch.zeros(2, dtype=torch.int64, pin_memory=pinned)
        self._words = self.flag.numpy()  # the host's writes and reads, without a torch op
        self.ticket = 0
        self._jobs: queue.SimpleQueue[tuple[list[tuple[llguidance.LLMatcher, int]], torch.Tensor, int, float]] = \
            queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._error: BaseException | None = None
        sys.setswitchinterval(masker.SWITCH_S)
        threading.Thread(target=self._run, name="switchyard-grammar-fill", daemon=True).start()

    def submit(self, todo: list[tuple[llguidance.LLMatcher, int]], bm: torch.Tensor) -> int:
        self.ticket += 1
        self._idle.clear()
        self._jobs.put((todo, bm, self.ticket, time.perf_counter()))
        return self.ticket

    def _run(self) -> None:
        while True:
            todo, bm, ticket, submitted = self._jobs.get()
            try:
                self.masker.last_fill_s = self.masker._fill(todo, bm)
            except BaseException as e:  # the engine's thread raises it (join)
                self._error = e
            finally:
                self._words[0] = ticket  # last: the GPU reads the bits once it sees this
                self.masker.last_ready_s = time.perf_counter() - submitted
                self._idle.set()

    def join(self) -> None:
        self._idle.wait()
        if self._error is not None:
            e, self._error = self._error, None
            raise e
        raise_if_gave_up(self._words)


def raise_if_gave_up(flag: Any) -> None:
    """EngineFailed if the masking kernel gave up waiting for a fill: it wrote that fill's ticket into
    flag[1] (token_mask's wait), which is cleared here. flag: the host's int64 view of the pinned words."""
    if flag[1]:
        ticket, flag[1] = int(flag[1]), 0
        raise EngineFailed(f"the GPU gave up waiting for the grammar masks of fill {ticket}")


@functools.cache
def fused_mask() -> Callable[[torch.Tensor, torch.Tensor, list[int]], None] | None:
    """The Triton masking kernel's entry, or None where triton does not load (then torch's ops).
    Imported on the first GPU step only: a CPU server never loads triton for its masks."""
    try:
        from switchyard.engine.backends.cuda.token_mask import apply_token_bitmask_cuda
    except ImportError:
        return None
    return apply_token_bitmask_cuda
