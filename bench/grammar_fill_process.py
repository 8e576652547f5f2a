"""A bench prototype: the grammar masks filled by a process of its own, not a thread of the engine's.

The served masker fills on a thread (chat/grammar.GrammarMasker, filled ahead), which hands over the GIL
with the engine's thread twice a step, each hand-over a thread wake-up (~0.1 ms on the GPU hosts,
bench/gil_handoff.py). Here a process that shares no interpreter with the engine mirrors each row's matcher
and fills the masks; the two meet only in shared memory, each polling it without sleeping:

- the engine's side (ProcessMasker.apply) writes, for each constrained row, its slot, its bitmask row and the
  tokens it accepted since the last step (Recorded states keep them), then the step's ticket;
- the fill process spins on that ticket, feeds the tokens to its mirror matchers, fills their masks into the
  shared bitmask (llguidance's pool for four rows or more) and writes the ticket back, which the masking
  kernel waits for on the GPU (the segment is registered with CUDA, so the GPU reads it in place) as it waits
  for the fill thread's.

Bench-only: the rows' grammar is one constraint given up front (the bench's), compiled over `lanes` in the
process; engine_cuda.py --process-fill runs it beside the served fill. The engine's matchers still take the
tokens (the output stage's accepts and `done` are unchanged), so the process's are a mirror.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch

from switchyard.engine.chat.grammar import GrammarMasker, GrammarState, _fused_mask
from switchyard.engine.errors import EngineFailed

# The header's int64 words: the ticket done (the masking kernel's flag[0]), a ticket the kernel gave up
# on (its flag[1]), the step's ticket, its rows, its bitmask buffer, stop, the fill's ns, the process ready.
DONE, GAVE_UP, TICKET, ROWS, BUF, STOP, FILL_NS, READY = range(8)
HEADER = 8
NEW = 1 << 40  # a row's slot word with this bit: a new matcher in that slot (from lane slot % lanes)
RESET = -1  # a token word: the row's matcher reset (a tool call's row that starts another call)
MAX_NEW = 4  # tokens a row may carry into a step (one, a reset and one more, at most)
IDLE_S = 0.005  # the fill process spins for steps until none came for this long, then naps


@dataclass
class Recorded(GrammarState):
    """A row's matcher on the engine's side, keeping the tokens it accepts for the fill process; with
    `endless`, a row whose call is complete starts another (engine_cuda.grammar_factory's tool calls)."""

    endless: bool = False
    new: list[int] = field(default_factory=list)
    slot: int = -1

    def accept(self, token: int) -> None:
        super().accept(token)
        self.new.append(token)
        if self.endless and not self.failed and self.matcher.is_stopped():
            self.matcher.reset()
            self.new.append(RESET)


def _serve(name: str, words: int, max_rows: int, tokenizer_json: str, vocab: int, eos: list[int], lark: str,
           lanes: int, threads: int) -> None:
    """The fill process: mirror matchers, filled when a step's ticket comes."""
    import llguidance

    shm = shared_memory.SharedMemory(name=name)
    hdr, rows, bms = _views(shm.buf, words, max_rows)
    tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=eos)
    tmpl = [llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(lark), log_level=0) for _ in range(lanes)]
    executor = llguidance.LLExecutor(threads) if threads > 1 else None
    matchers: dict[int, Any] = {}
    row_bytes = words * 4
    seen, parent, spins, last = 0, os.getppid(), 0, time.perf_counter()
    hdr[READY] = 1
    while not hdr[STOP]:
        t = int(hdr[TICKET])
        if t == seen:
            spins += 1
            if spins & 0xFFFF == 0 and os.getppid() != parent:
                return  # the engine is gone
            if time.perf_counter() - last > IDLE_S:
                time.sleep(0.001)  # no step for a while: stop burning a core (the next one waits <= 1 ms)
            continue
        seen = t
        t0 = time.perf_counter_ns()
        n, bm = int(hdr[ROWS]), bms[int(hdr[BUF])]
        todo = []
        for slot, row, k, *new in rows[:n].tolist():  # one conversion: numpy's scalars are slow to loop over
            if slot & NEW:
                slot ^= NEW
                matchers[slot] = tmpl[slot % lanes].deep_copy()
            m = matchers[slot]
            for x in new[:k]:
                if x == RESET:
                    m.reset()
                else:
                    m.consume_token(x)
            todo.append((m, row))
        base = bm.ctypes.data
        if executor is not None and n >= GrammarMasker.PAR_ROWS:
            executor.unsafe_compute_mask_ptr(todo, base, row_bytes, bm.shape[0])
        else:
            for m, row in todo:
                m.unsafe_compute_mask_ptr(base + row * row_bytes, row_bytes)
        hdr[FILL_NS] = time.perf_counter_ns() - t0
        hdr[DONE] = t  # last: the GPU reads the bits once it sees this
        last = time.perf_counter()


def _views(buf: Any, words: int, max_rows: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The segment as the header, the rows' table [max_rows, 3 + MAX_NEW] and two bitmask buffers."""
    hdr = np.ndarray((HEADER,), np.int64, buf)
    rows = np.ndarray((max_rows, 3 + MAX_NEW), np.int64, buf, HEADER * 8)
    off = (HEADER + max_rows * (3 + MAX_NEW)) * 8
    bms = [np.ndarray((max_rows, words), np.int32, buf, off + i * max_rows * words * 4) for i in range(2)]
    return hdr, rows, bms


class ProcessMasker(GrammarMasker):
    """GrammarMasker's interface, the fill in a process (see above); rows' states must be Recorded."""

    def __init__(self, vocab_size: int, tokenizer_json: str, eos: list[int], lark: str, lanes: int, threads: int,
                 max_rows: int = 256, cuda: bool = True) -> None:
        super().__init__(vocab_size, threads=1, ahead=True)
        self.max_rows = max_rows
        size = (HEADER + max_rows * (3 + MAX_NEW)) * 8 + 2 * max_rows * self.words * 4
        self.shm = shared_memory.SharedMemory(create=True, size=size)
        self.hdr, self.rows, bms = _views(self.shm.buf, self.words, max_rows)
        self.hdr[:] = 0
        whole = torch.frombuffer(self.shm.buf, dtype=torch.uint8)
        self._registered = cuda and torch.cuda.is_available()
        if self._registered:  # pinned in place: the masking kernel reads the flag and the bits over the bus
            err = torch.cuda.cudart().cudaHostRegister(whole.data_ptr(), size, 0)
            if int(err) != 0 or not whole.is_pinned():
                raise EngineFailed(f"the shared segment could not be pinned: {err}")
        self.flag = torch.frombuffer(self.shm.buf, dtype=torch.int64, count=2)
        off = (HEADER + max_rows * (3 + MAX_NEW)) * 8
        self.bitmasks = [torch.frombuffer(self.shm.buf, dtype=torch.int32, count=max_rows * self.words,
                                          offset=off + i * max_rows * self.words * 4).view(max_rows, self.words)
                         for i in range(2)]
        del bms
        self.ticket = 0
        self._slots = 0
        self.proc = mp.get_context("spawn").Process(
            target=_serve, args=(self.shm.name, self.words, max_rows, tokenizer_json, vocab_size, eos, lark, lanes,
                                 threads), daemon=True)
        self.proc.start()
        deadline = time.monotonic() + 120
        while not self.hdr[READY]:  # its grammars compiled: a step's masking must not wait on its start-up
            if not self.proc.is_alive() or time.monotonic() > deadline:
                raise EngineFailed("the grammar fill process did not start")
            time.sleep(0.01)

    def apply(self, logits: torch.Tensor, states: list[GrammarState | None]) -> None:
        self.wait()
        live = [(i, s) for i, s in enumerate(states) if s is not None]
        if not live:
            return
        assert len(states) <= self.max_rows
        table = []
        for i, s in live:
            assert isinstance(s, Recorded) and len(s.new) <= MAX_NEW
            slot = s.slot
            if slot < 0:
                s.slot = slot = self._slots
                self._slots += 1
                slot |= NEW
            table.append([slot, i, len(s.new), *s.new, *(0,) * (MAX_NEW - len(s.new))])
            s.new = []
        self.rows[:len(table)] = table  # one write: a numpy assignment a row cost ~3 us
        self.ticket += 1
        buf = self.ticket & 1
        self.hdr[ROWS], self.hdr[BUF] = len(live), buf
        self.hdr[TICKET] = self.ticket  # last: the process reads the rows once it sees this
        rows = [i for i, _ in live]
        fused = _fused_mask()
        assert fused is not None, "the process fill needs the masking kernel (triton)"
        fused(logits, self.bitmasks[buf][:len(states)], rows, (self.flag, self.ticket))  # type: ignore[call-arg]

    def wait(self) -> None:
        """Until the last step is filled (spinning: it is, by the time its tokens are read)."""
        if self.ticket == 0:
            return
        spins = 0
        while self.hdr[DONE] < self.ticket:
            spins += 1
            if spins % 100_000 == 0 and not self.proc.is_alive():
                raise EngineFailed("the grammar fill process died")
        if self.hdr[GAVE_UP]:
            raise EngineFailed(f"the GPU gave up waiting for the grammar masks of fill {int(self.hdr[GAVE_UP])}")
        self.last_fill_s = int(self.hdr[FILL_NS]) * 1e-9

    def close(self) -> None:
        self.hdr[STOP] = 1
        self.proc.join(5)
        if self._registered:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaHostUnregister(self.flag.data_ptr())
        del self.hdr, self.rows, self.flag, self.bitmasks  # the segment's views, before it is closed
        self.shm.close()
        self.shm.unlink()


def process_fill(tok: Any, c: Any, tools: bool, lanes: int | None = None, threads: int | None = None) -> tuple[Any, Any]:
    """For engine_cuda.decode_rate: a factory of Recorded rows under constraint `c` (tool calls: endless)
    and one of the ProcessMasker that fills them (a GPU replica's lanes and threads unless given)."""
    from switchyard.engine.chat.grammar import Grammars
    from switchyard.engine.runner.options import auto_grammar_threads, grammar_lanes

    threads = threads or auto_grammar_threads("cuda")
    g = Grammars(tok.tok.to_str(), tok.vocab_size, sorted(tok.eos_ids))  # the engine's side: accepts only

    def row() -> Recorded:
        s = g.compile(c)
        return Recorded(s.matcher, vocab_size=s.vocab_size, lane=s.lane, endless=tools)

    made: list[ProcessMasker] = []

    def masker() -> ProcessMasker:
        """One process for every run (a run's rows take new slots): its start-up, seconds, is paid once."""
        if not made:
            made.append(ProcessMasker(tok.vocab_size, tok.tok.to_str(), sorted(tok.eos_ids), c.grammar,
                                      lanes or grammar_lanes(threads), threads))
            atexit.register(made[0].close)
        return made[0]
    return row, masker
