"""A GPU replica's grammar masks filled by a process of their own (`--grammar-fill auto`, the default on a GPU).

The masker's fill thread (chat/grammar.GrammarMasker, filled ahead) shares the engine's interpreter: it
takes the GIL to start a step's fill and again to write its ticket, and each hand-over costs the thread
that waits a wake-up (~0.1 ms on the GPU hosts, bench/gil_handoff.py), at SmolLM2's 0.4 ms step a
quarter of it. Here a process mirrors each constrained row's matcher and the two sides meet in shared
memory, each polling it without sleeping:

- the engine's thread (ProcessMasker.apply) writes, for each constrained row, its slot, its bitmask row and
  the tokens its matcher accepted since the last step, then the step's ticket, and queues the masking
  kernel, which waits on the GPU for the ticket to come back (as for the fill thread's; the segment is
  registered with CUDA, so the GPU reads the bits and the ticket in place);
- the process spins on the ticket, feeds the tokens to its mirror matchers, fills their masks into the
  shared bitmask (llguidance's pool for four rows or more, rows spread over lanes as Grammars does) and
  writes the ticket back. A row's grammar reaches it once, over a pipe, when the row is first masked; a
  row's matcher is dropped once its state is (weakref.finalize);
- early tokens (ProcessMasker.early, EARLY): once the engine's thread has read a step's tokens, before
  it accepts and streams them and launches the next step, it hands them to the process, whose mirrors
  take them and fill the next step's masks at the rows they had; the next ticket moves a row that
  changed places (rows before it finished) and fills only rows that took more (a reset, a new row).
  Without it the fill started after the engine's turn, and at SmolLM2's batch 16 the GPU waited for it.
  A mirror that takes a token early writes beside it whether the token ended the reply or was refused;
  the engine's matcher does not take that token, and its `done` reads that word (mirror_done): at
  SmolLM2's batch 16 the engine's 16 accepts had cost its thread ~40 us a step (~5% of the GPU's step).

The engine's own matchers take a row's tokens until its first early one (its first step's token, and
every token where EARLY is off). On an H100, SmolLM2's shape at batches 1 and 16 ran a tool call's
grammar 0.99x and 0.98x as fast as free decoding this way, the fill thread 0.96x and 0.96x
(bench/results/gpu_fill_lanes, call 4, a bench prototype of this module); this module, served on an
H200, ran SmolLM2 at batch 1 1.04x (items) and 0.96x (tool calls), the thread 0.80x and 0.61x (call 6).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import weakref
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch

from switchyard.engine.chat.grammar import (
    RESET,
    GrammarMasker,
    GrammarState,
    fused_mask,
    ll_tokenizer,
    raise_if_gave_up,
)
from switchyard.engine.errors import EngineFailed

# The header's int64 words: the ticket done (the masking kernel's flag[0]), a ticket the kernel gave up on
# (its flag[1]), the step's ticket, its rows, its bitmask buffer, the pipe's messages sent, stop, the
# fill's ns, the process ready, the ticket whose fill raised, the early tokens' count of handovers and rows;
# then the last step's timeline (bench/engine_cuda.py reports it; perf_counter_ns is one clock for both
# processes): the engine's handover ns, the process's ns from it to seeing it, its mirrors' ns consuming, and
# its ns from the early fill done to the ticket seen (how long the fill waited for the engine's turn).
(DONE, GAVE_UP, TICKET, ROWS, BUF, MESSAGES, STOP, FILL_NS, READY, FAILED, EARLY, EARLY_ROWS,
 EARLY_T, PICKUP_NS, CONSUME_NS, TICKET_GAP_NS) = range(16)
HEADER = 16
ERROR_BYTES = 1024  # the text of the fill's error, after the header
NEW = 1 << 40  # a slot word with this bit: the row's first step (its matcher made from the pipe's grammar)
MAX_NEW = 4  # tokens a row may carry into a step (one, at most a reset and another beside it)
# What a mirror made of an early token (the early table's last column): not yet written, the reply goes on,
# the grammar is complete, the token refused, or nothing known (the mirrors failed: the next ticket says why).
PENDING, GOES_ON, STOPPED, REFUSED, UNKNOWN = -1, 0, 1, 2, 3
IDLE_S = 0.005  # the process spins for steps until none came for this long, then naps 1 ms at a time


def _views(buf: Any, words: int, max_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray], int]:
    """The segment's header, row table [max_rows, 3 + MAX_NEW], early table [max_rows, 4] (slot, row,
    token, what the mirror made of it), two bitmask buffers [max_rows, words] (last: the part the GPU
    reads) and the error text's offset."""
    hdr = np.ndarray((HEADER,), np.int64, buf)
    err = HEADER * 8
    table = np.ndarray((max_rows, 3 + MAX_NEW), np.int64, buf, err + ERROR_BYTES)
    early = np.ndarray((max_rows, 4), np.int64, buf, err + ERROR_BYTES + table.nbytes)
    off = err + ERROR_BYTES + table.nbytes + early.nbytes
    bms = [np.ndarray((max_rows, words), np.int32, buf, off + i * max_rows * words * 4) for i in range(2)]
    return hdr, table, early, bms, err


def _size(words: int, max_rows: int) -> int:
    return HEADER * 8 + ERROR_BYTES + max_rows * (3 + MAX_NEW + 4) * 8 + 2 * max_rows * words * 4


def _fill(executor: Any, todo: list[tuple[Any, int]], bm: np.ndarray) -> None:
    """llguidance writes each (matcher, row)'s mask into bm's row (its pool for PAR_ROWS rows or more)."""
    base, row_bytes = bm.ctypes.data, bm.shape[1] * 4
    if executor is not None and len(todo) >= GrammarMasker.PAR_ROWS:
        executor.unsafe_compute_mask_ptr(todo, base, row_bytes, bm.shape[0])
    else:
        for m, row in todo:
            m.unsafe_compute_mask_ptr(base + row * row_bytes, row_bytes)


def _serve(name: str, conn: Any, words: int, max_rows: int, tokenizer_json: str, vocab: int, eos: list[int],
           lanes: int, threads: int, cache_size: int, cpus: list[int] | None) -> None:
    """The fill process's loop: mirror matchers, filled when a step's ticket comes."""
    import llguidance

    if cpus:  # before the pool: its threads inherit the mask
        os.sched_setaffinity(0, cpus)
    shm = shared_memory.SharedMemory(name=name)
    hdr, table, early, bms, err_at = _views(shm.buf, words, max_rows)
    tok = ll_tokenizer(tokenizer_json, vocab, eos)
    executor = llguidance.LLExecutor(threads) if threads > 1 else None
    compiled: dict[tuple[str, int], Any] = {}  # (grammar, lane) -> a matcher in its start state
    matchers: dict[int, Any] = {}
    grammars: dict[int, str] = {}  # a new slot's grammar, until its first step
    early_at: dict[int, int] = {}  # slot -> the row its next mask went to, filled from early tokens
    received, seen, seen_early, early_ns, early_done, parent, spins, early_error = 0, 0, 0, 0, 0, os.getppid(), 0, ""
    last = time.perf_counter()
    hdr[READY] = 1
    while not hdr[STOP]:
        t = int(hdr[TICKET])  # before EARLY: the engine writes EARLY first, so a new ticket's early is seen
        handover = int(hdr[EARLY])
        if handover != seen_early:
            # The step just filled has its tokens on the engine's host, before its turn: the mirrors take
            # them and the next step's masks fill into its buffer, at the rows they had, while the engine
            # accepts, streams and launches. The ticket then moves any row that changed places.
            seen_early, t0 = handover, time.perf_counter_ns()
            hdr[PICKUP_NS] = t0 - hdr[EARLY_T]
            n = int(hdr[EARLY_ROWS])
            rows = early[:n].tolist()
            try:
                todo = [(matchers[slot], row) for slot, row, _, _ in rows]
                for k, ((m, _), (_, _, token, _)) in enumerate(zip(todo, rows, strict=True)):
                    # Each row's word as soon as it is known: the engine's thread reads it as it reaches the row.
                    early[k, 3] = (GOES_ON if not m.is_stopped() else STOPPED) if m.consume_token(token) else REFUSED
            except Exception as ex:  # a mirror may have missed its token: the next ticket fails
                early_error = f"{type(ex).__name__}: {ex}"
                col = early[:n, 3]
                col[col == PENDING] = UNKNOWN
            else:
                hdr[CONSUME_NS] = time.perf_counter_ns() - t0
                try:
                    _fill(executor, todo, bms[(seen + 1) & 1])
                    early_at.update((slot, row) for slot, row, _, _ in rows)
                except Exception:  # the ticket fills these rows itself (their tokens are in)
                    pass
            early_done = time.perf_counter_ns()
            early_ns = early_done - t0
            last = time.perf_counter()
            continue
        if t == seen:
            spins += 1
            if spins & 0xFFFF == 0 and os.getppid() != parent:
                return  # the engine is gone
            if time.perf_counter() - last > IDLE_S:
                time.sleep(0.001)
            continue
        seen = t
        t0 = time.perf_counter_ns()
        hdr[TICKET_GAP_NS] = t0 - early_done if early_ns else 0
        try:
            if early_error:
                raise RuntimeError(f"early tokens: {early_error}")
            while received < hdr[MESSAGES]:
                kind, arg, grammar = conn.recv()
                received += 1
                if kind == "new":
                    grammars[arg] = grammar
                else:  # "free": slots whose rows are gone
                    for slot in arg:
                        matchers.pop(slot, None)
            n, bm = int(hdr[ROWS]), bms[int(hdr[BUF])]
            todo, moved_from, moved_to = [], [], []
            for slot, row, k, *new in table[:n].tolist():  # one conversion: numpy's scalars loop slowly
                if slot & NEW:
                    slot ^= NEW
                    key = (grammars.pop(slot), slot % lanes)
                    tmpl = compiled.get(key)
                    if tmpl is None:
                        tmpl = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(key[0]), log_level=0)
                        if tmpl.is_error():  # the engine compiled it: a mirror that cannot is a bug, said once
                            raise RuntimeError(tmpl.get_error())
                        compiled[key] = tmpl
                        while len(compiled) > cache_size:
                            del compiled[next(iter(compiled))]
                    matchers[slot] = tmpl.deep_copy()
                m = matchers[slot]
                at = early_at.get(slot)
                if at is not None and k == 0:  # filled from its early token
                    if at != row:
                        moved_from.append(at)
                        moved_to.append(row)
                    continue
                for x in new[:k]:  # a token it refuses, the engine's matcher refused too: that row stops
                    if x == RESET:
                        m.reset()
                    else:
                        m.consume_token(x)
                todo.append((m, row))
            if moved_to:  # before the fill: a moved row's old place may be another row's now
                bm[moved_to] = bm[moved_from]
            _fill(executor, todo, bm)
        except Exception as e:  # the engine's thread raises it; the ticket still comes (the GPU must not hang)
            text = f"{type(e).__name__}: {e}".encode()[:ERROR_BYTES - 1]
            shm.buf[err_at:err_at + len(text) + 1] = text + b"\0"
            hdr[FAILED] = t
        early_at.clear()
        hdr[FILL_NS] = time.perf_counter_ns() - t0 + early_ns
        early_ns, early_error = 0, ""
        hdr[DONE] = t  # last: the GPU reads the bits once it sees this
        last = time.perf_counter()


class ProcessMasker(GrammarMasker):
    """GrammarMasker's apply() and wait(), the masks filled by a process of their own (see above). Made
    by the output stage for GPU logits; raises EngineFailed if the process cannot start or its segment
    cannot be pinned (the caller then fills on a thread). `cpus`: the process's CPUs (engine/affinity.py's
    layout, --pin-cpus), else any."""

    WHERE = "process"
    EARLY = True  # a step's tokens handed over as the host reads them (False: with the next step's rows)
    THREADS: int | None = None  # the process's fill threads where set (the bench's ab), else the output stage's
    LANES: int | None = None  # the process's lanes (compilations a grammar) where set (the bench's ab), else the caller's

    def __init__(self, vocab_size: int, tokenizer_json: str, eos_ids: list[int], threads: int, lanes: int,
                 max_rows: int, cache_size: int = 256, pinned: bool = True, cpus: list[int] | None = None) -> None:
        super().__init__(vocab_size, threads=1, ahead=True)
        self.max_rows = max_rows
        size = _size(self.words, max_rows)
        self.shm = shared_memory.SharedMemory(create=True, size=size)
        self.hdr, self.table, self.early_table, _, self._err_at = _views(self.shm.buf, self.words, max_rows)
        self._early = 0  # handovers of early tokens
        self.hdr[:] = 0
        whole = torch.frombuffer(self.shm.buf, dtype=torch.uint8)
        self._pinned = pinned
        if pinned:  # in place for the GPU: the masking kernel reads the ticket and the bits over the bus
            cudart = torch.cuda.cudart()
            err = int(cudart.cudaHostRegister(whole.data_ptr(), size, 0))
            if err != 0 or not whole.is_pinned():
                cudart.cudaGetLastError()  # else the next kernel launch's check raises it
                del whole
                self._release(registered=False)
                raise EngineFailed(f"the grammar fill's shared memory could not be pinned (cudaError {err})")
        self.flag = whole[:16].view(torch.int64)
        off = size - 2 * max_rows * self.words * 4
        self.bitmasks = [whole[off + i * max_rows * self.words * 4: off + (i + 1) * max_rows * self.words * 4]
                         .view(torch.int32).view(max_rows, self.words) for i in range(2)]
        del whole
        self.ticket = 0
        self._slots = 0
        self._messages = 0
        self._freed: list[int] = []  # slots whose rows' states are gone, for the next step's message
        self._conn, child = mp.get_context("spawn").Pipe()
        self.proc = mp.get_context("spawn").Process(
            target=_serve, name="switchyard-grammar-fill", daemon=True,
            args=(self.shm.name, child, self.words, max_rows, tokenizer_json, vocab_size, eos_ids, self.LANES or lanes,
                  self.THREADS or threads, cache_size, cpus))
        self.proc.start()
        deadline = time.monotonic() + 120
        while not self.hdr[READY]:  # its tokenizer read (~1 s): no step's masking may wait on its start-up
            if not self.proc.is_alive() or time.monotonic() > deadline:
                self.close()
                raise EngineFailed("the grammar fill process did not start")
            time.sleep(0.01)

    def apply(self, logits: torch.Tensor, states: list[GrammarState | None]) -> None:
        self.wait()
        live = [(i, s) for i, s in enumerate(states) if s is not None]
        if not live:
            return
        if len(states) > self.max_rows:
            raise EngineFailed(f"{len(states)} rows for a grammar fill made for {self.max_rows}")
        if self._freed:
            # Popped one by one: a finalizer may append between a read of the list and its replacement.
            freed = [self._freed.pop() for _ in range(len(self._freed))]
            self._send("free", freed, "")
        table = []
        for i, s in live:
            slot = s.slot
            if slot < 0:  # the row's first step: its grammar goes to the process, its tokens are kept from now
                s.slot = slot = self._slots
                self._slots += 1
                s.new = []
                weakref.finalize(s, self._freed.append, slot)
                self._send("new", slot, s.grammar)
                slot |= NEW
            new = (s.new or [])[s.sent:]  # those handed over early, the process has
            if len(new) > MAX_NEW:
                raise EngineFailed(f"a constrained row took {len(new)} tokens in one step")
            table.append([slot, i, len(new), *new, *(0,) * (MAX_NEW - len(new))])
            s.new, s.sent = [], 0
        self.table[:len(table)] = table  # one write: a numpy assignment a row cost ~3 us
        self.ticket += 1
        buf = self.ticket & 1
        self.hdr[ROWS], self.hdr[BUF] = len(table), buf
        self.hdr[TICKET] = self.ticket  # last: the process reads the rows once it sees this
        fused = fused_mask()
        if fused is None:
            raise EngineFailed("the grammar fill process needs the masking kernel (triton)")
        fused(logits, self.bitmasks[buf][:len(states)], [i for i, _ in live],  # type: ignore[call-arg]
              (self.flag, self.ticket))

    def early(self, states: list[GrammarState | None], tokens: list[int]) -> None:
        """The step's tokens to the process before the engine's turn (GrammarMasker.early): each row
        with a mirror and nothing else pending. Its mirror takes the token and the next step's mask
        fills while this thread accepts, streams and launches; the row's next table entry then carries
        only what came after (`sent`). At SmolLM2's batch 16 the fill had waited for that turn. Its callers ask
        it only where EARLY holds (the output stage; a bench turns EARLY off)."""
        if self.ticket == 0:
            return
        rows = [(s.slot, i, tok, PENDING) for i, (s, tok) in enumerate(zip(states, tokens, strict=True))
                if s is not None and s.slot >= 0 and not s.new and not s.failed]
        if not rows:
            return
        for k, (_, i, _, _) in enumerate(rows):
            s = states[i]
            s.sent, s.mirror = 1, (self, k)  # type: ignore[union-attr]
        self.early_table[:len(rows)] = rows
        self.hdr[EARLY_ROWS] = len(rows)
        self.hdr[EARLY_T] = time.perf_counter_ns()
        self._early += 1
        self.hdr[EARLY] = self._early  # last: the process reads the rows once it sees this

    def mirror_done(self, s: GrammarState, k: int) -> bool:
        """GrammarState.done for a row whose last token went early (its early row k): whether its mirror
        found the reply complete or the token refused (then s.failed). The process writes each row's word
        as its mirror takes the token, ahead of the engine's thread reaching the row."""
        if "early_table" not in self.__dict__:
            raise EngineFailed("the grammar fill process is closed")
        said, spins = int(self.early_table[k, 3]), 0
        while said == PENDING:
            spins += 1
            if spins % 100_000 == 0 and not self.proc.is_alive():
                raise EngineFailed("the grammar fill process died")
            said = int(self.early_table[k, 3])
        if said == REFUSED:
            s.failed = True
        return said in (STOPPED, REFUSED)

    def _send(self, kind: str, arg: Any, grammar: str) -> None:
        self._conn.send((kind, arg, grammar))
        self._messages += 1
        self.hdr[MESSAGES] = self._messages

    def wait(self) -> None:
        """Until the last step is filled (by the time its tokens are read, it is); raises what its fill
        raised, or EngineFailed if the process died or the GPU gave up waiting."""
        if self.ticket == 0:
            return
        spins = 0
        while self.hdr[DONE] < self.ticket:
            spins += 1
            if spins % 100_000 == 0 and not self.proc.is_alive():
                raise EngineFailed("the grammar fill process died")
        if self.hdr[FAILED] == self.ticket:
            text = bytes(self.shm.buf[self._err_at:self._err_at + ERROR_BYTES]).split(b"\0")[0].decode()
            self.hdr[FAILED] = 0
            raise EngineFailed(f"the grammar fill failed: {text}")
        raise_if_gave_up(self.hdr)  # the header's first two words are the kernel's flag (DONE, GAVE_UP)
        self.last_fill_s = int(self.hdr[FILL_NS]) * 1e-9

    @property
    def last_early_s(self) -> tuple[float, float, float]:
        """The latest early hand-over's timeline, seconds (the bench reads it after a step; read, not kept, so
        the engine's thread pays nothing for it): to the process seeing it, its mirrors' consumes, and from
        the early fill done to the next ticket seen (0 where that ticket had no early tokens before it)."""
        return (int(self.hdr[PICKUP_NS]) * 1e-9, int(self.hdr[CONSUME_NS]) * 1e-9, int(self.hdr[TICKET_GAP_NS]) * 1e-9)

    def close(self) -> None:
        """Stop the process and free the segment, unregistered once the GPU is done with it (an address
        left registered would refuse the next segment mapped there). The output stage's, once its loop ends."""
        if "hdr" not in self.__dict__:  # closed already
            return
        self.hdr[STOP] = 1
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
        self._release(registered=self._pinned)

    def _release(self, registered: bool) -> None:
        if registered:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaHostUnregister(self.flag.data_ptr())
        # The segment's views, before it is closed: one read after would read unmapped memory (a crash).
        for name in ("hdr", "table", "early_table", "flag", "bitmasks"):
            self.__dict__.pop(name, None)
        self.shm.close()
        self.shm.unlink()
