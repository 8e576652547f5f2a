"""Rank 0's scheduler: continuous batching over a paged KV cache.

New requests wait in a bounded queue; between decode steps they are admitted (prefilled
together, right-padded) while decode slots are free, then join the running batch. At
admission a request takes the longest cached run of its prompt's leading blocks (automatic
prefix caching, see kv_blocks) and prefills only the rest. Blocks are taken as each step
needs them; when the pool runs out, the most recently admitted sequence is preempted: its
blocks are freed (the full ones stay cached) and it goes back to the front of the queue, to
be prefilled again, prompt and output so far, when there is room (vLLM's recompute). Each
step, block tables included, is broadcast to the other ranks before it runs. A collective
failure stops everything (fail-stop): every open request gets an error and the process exits
non-zero.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading

import torch

from switchyard.engine.chat.tokenizer import ChatTokenizer, Detokenizer
from switchyard.engine.core.kv_blocks import BlockPool
from switchyard.engine.core.output import OutputStage
from switchyard.engine.core.sampling import make_generator
from switchyard.engine.core.sequence import Sequence
from switchyard.engine.errors import EngineFailed, QueueFull
from switchyard.engine.model.step import Step
from switchyard.engine.runner.broadcast import HEARTBEAT, STOP
from switchyard.engine.runner.model_runner import Runner

log = logging.getLogger("switchyard.engine.core.scheduler")


class Scheduler:
    def __init__(self, runner: Runner, tokenizer: ChatTokenizer, max_num_seqs: int, max_model_len: int,
                 max_waiting: int = 256, max_prefill_tokens: int = 4096, heartbeat_s: float = 0.5,
                 max_num_batched_tokens: int = 512, pool: BlockPool | None = None) -> None:
        self.runner = runner
        self.tok = tokenizer
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_waiting = max_waiting
        self.max_prefill_tokens = max_prefill_tokens
        self.heartbeat_s = heartbeat_s
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.prefilling: list[Sequence] = []  # admitted (a slot each), prompt not all cached yet
        self.running: list[Sequence] = []
        # Chunked prefill where the model can continue a cached prompt: each step prefills at
        # most this many prompt tokens, then the running sequences take a decode step, so a
        # long prompt delays the others' next token by one chunk, not by its whole prefill.
        self.chunk = max_num_batched_tokens if runner is not None and runner.chunked_prefill else 0
        self.free_slots = list(range(max_num_seqs))
        # Default: the runner's pool in blocks of 16 (rank 0's start-up passes the options' pool).
        self.pool = pool or BlockPool(runner.num_kv_blocks if runner is not None
                                      else max_num_seqs * -(-max_model_len // 16), 16)
        bs = self.pool.block_size
        # Each decode slot's block table, kept up to date as blocks are taken, so that a step's
        # tables are one index_select, not a tensor built from lists.
        self._tables = torch.zeros(max_num_seqs, -(-max_model_len // bs), dtype=torch.int64)
        self._admissions = itertools.count(1)
        self._aborted: set[int] = set()
        self._cv = threading.Condition()
        self._stop = False
        self.failed: str | None = None
        self.output = OutputStage(tokenizer, max_model_len)
        self.stats = self.output.stats  # counters the output stage and the scheduler share

    # -- called from the HTTP thread -------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        with self._cv:
            if self.failed:
                raise EngineFailed(f"engine failed: {self.failed}")
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"the waiting queue is full ({self.max_waiting} requests)")
            seq.detok = Detokenizer(self.tok)
            seq.generator = make_generator(seq.params)
            self.waiting.append(seq)
            self._cv.notify()

    def abort(self, seq_id: int) -> None:
        with self._cv:
            self._aborted.add(seq_id)
            self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()

    @property
    def num_running(self) -> int:
        return len(self.running) + len(self.prefilling)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        """Share of the KV blocks held by sequences (cached blocks nobody holds count as free)."""
        return self.pool.usage

    # -- the engine thread -----------------------------------------------------------------

    def loop(self) -> None:
        """Run until stop() or a failure. Raises on failure after failing every request."""
        try:
            with torch.inference_mode():
                while True:
                    with self._cv:
                        self._drop_aborted()
                        if self._stop:
                            break
                        if not self.waiting and not self.running and not self.prefilling:
                            self._cv.wait(self.heartbeat_s)
                            idle = not self.waiting and not self.running and not self._stop
                        else:
                            idle = False
                        self._admit()
                    if idle:
                        self.runner.signal(HEARTBEAT)
                        continue
                    # A prompt that finds no blocks (older sequences hold them) waits: decode goes on.
                    prefilled = bool(self.prefilling) and self._prefill()
                    # Unchunked, new prompts go first (as before); chunked, every step also decodes.
                    if self.running and (self.chunk or not prefilled):
                        self._decode()
            self.runner.signal(STOP)
        except BaseException as e:
            self.fail(f"{type(e).__name__}: {e}")
            raise

    def fail(self, reason: str) -> None:
        with self._cv:
            self.failed = reason
            victims = list(self.waiting) + list(self.prefilling) + list(self.running)
            self.waiting.clear()
            self.prefilling.clear()
            self.running.clear()
        log.error("engine failed: %s", reason)
        for s in victims:
            s.sink({"type": "error", "message": f"engine failed: {reason}"})

    def _drop_aborted(self) -> None:
        if not self._aborted:
            return
        self.waiting = collections.deque(s for s in self.waiting if s.id not in self._aborted)
        for group in (self.prefilling, self.running):
            keep = []
            for s in group:
                if s.id in self._aborted:
                    self._release(s)
                else:
                    keep.append(s)
            group[:] = keep
        self._aborted.clear()

    def _admit(self) -> None:
        """Give waiting sequences free slots and their cached prefix; the rest of their prompts
        (after a preemption: prompt and output so far) is prefilled by the next steps."""
        admitted = False
        while self.waiting and self.free_slots and self.num_running < self.max_num_seqs:
            nxt = self.waiting[0]
            first = nxt.admitted == 0
            # Blocks for its first step or it waits (first come, first served): a newcomer never
            # preempts a running sequence.
            cached = self.pool.admit(nxt.kv, nxt.tokens(0, nxt.ctx_len), self.chunk, count=first)
            if cached is None:
                break
            self.waiting.popleft()
            nxt.computed = cached
            if first:
                nxt.admitted = next(self._admissions)
                nxt.cached_tokens = cached
            self.free_slots.sort()
            nxt.slot = self.free_slots.pop(0)  # lowest slot first keeps the decode view small
            self._sync_table(nxt, 0)
            self.prefilling.append(nxt)
            admitted = True
        if admitted:
            self.prefilling.sort(key=lambda s: s.admitted)  # one coming back from preemption goes first

    def _sync_table(self, s: Sequence, start: int) -> None:
        if len(s.kv.table) > start:
            self._tables[s.slot, start:len(s.kv.table)] = torch.tensor(s.kv.table[start:], dtype=torch.int64)

    def _reserve(self, s: Sequence, tokens: int) -> bool:
        """Blocks for s's first `tokens` positions, preempting sequences admitted after s while
        the pool is short. False when none is left to preempt (s itself holds what it has)."""
        had = len(s.kv.table)
        while not self.pool.grow(s.kv, tokens):
            later = [v for v in (*self.running, *self.prefilling) if v.admitted > s.admitted]
            if not later:
                return False
            self._preempt(max(later, key=lambda v: v.admitted))
        self._sync_table(s, had)
        return True

    def _preempt(self, v: Sequence) -> None:
        """Free v's blocks (its full ones stay cached) and put it back at the head of the queue."""
        log.info("preempting request %d (%d tokens in the cache, %d free blocks)", v.id, v.computed,
                 self.pool.num_free)
        self._release(v)
        v.computed = 0
        v.preemptions += 1
        self.stats["preemptions"] += 1
        self.running = [x for x in self.running if x is not v]
        self.prefilling = [x for x in self.prefilling if x is not v]
        self.waiting.appendleft(v)  # victims go youngest first, so the oldest ends up in front

    def _release(self, s: Sequence) -> None:
        self.pool.free(s.kv)
        if s.slot >= 0:
            self.free_slots.append(s.slot)
            s.slot = -1

    def _prefill(self) -> bool:
        """One prefill step: whole prompts, right-padded, up to max_prefill_tokens; chunked,
        at most `chunk` prompt tokens, a long prompt continuing over several steps. False when
        no prompt got the blocks it needs."""
        budget = self.chunk or self.max_prefill_tokens
        batch: list[Sequence] = []
        takes: list[int] = []
        for s in list(self.prefilling):  # admission order: only later ones are preempted below
            if s.slot < 0:
                continue  # preempted for an earlier row of this step
            left = s.ctx_len - s.computed
            n = min(left, budget) if self.chunk else left
            if n <= 0 or (batch and n > budget) or not self._reserve(s, s.computed + n):
                break
            batch.append(s)
            takes.append(n)
            budget -= n
        if not batch:
            return False
        B, T = len(batch), max(takes)
        starts = [s.computed for s in batch]
        ids = torch.zeros(B, T, dtype=torch.int64)
        for i, (s, n) in enumerate(zip(batch, takes, strict=True)):
            ids[i, :n] = torch.tensor(s.tokens(s.computed, s.computed + n), dtype=torch.int64)
        # Right padding continues each row's positions, kept inside the cache (it is not written).
        positions = (torch.tensor(starts).unsqueeze(1) + torch.arange(T)).clamp(max=self.max_model_len - 1)
        lens = torch.tensor(takes, dtype=torch.int64)
        ctx = torch.tensor([a + n for a, n in zip(starts, takes, strict=True)], dtype=torch.int64)
        slots = torch.tensor([s.slot for s in batch], dtype=torch.int64)
        tables = self._tables[slots, :self.pool.blocks_for(int(ctx.max()))]
        # A one-token step takes the decode path, which attends over a view of the slots.
        view = max(s.slot for s in batch) + 1 if T == 1 else 0
        logits = self.runner.run(Step(ids, positions, slots, lens, ctx, view, tables))
        done_rows = []
        for i, (s, n) in enumerate(zip(batch, takes, strict=True)):
            s.computed += n
            self.pool.commit(s.kv, s.tokens, s.computed)
            if s.computed == s.ctx_len:
                done_rows.append(i)
        if not done_rows:
            return True
        done = [batch[i] for i in done_rows]
        ids_done = {s.id for s in done}
        self.prefilling = [s for s in self.prefilling if s.id not in ids_done]
        for s in done:
            if not s.preemptions:
                self.stats["prompt_tokens"] += len(s.prompt)
        self.running.extend(done)
        self.running.sort(key=lambda s: s.slot)  # slots 0..B-1 in order: decode skips a scatter
        self._advance(done, logits[done_rows] if len(done_rows) < B else logits)
        return True

    def _decode(self) -> None:
        # Each sequence's next position needs a block: the oldest first, so that when the pool
        # is short the youngest are preempted (and one that finds nobody younger, itself).
        for s in sorted(self.running, key=lambda s: s.admitted):
            if s.slot >= 0 and not self._reserve(s, s.ctx_len):
                self._preempt(s)
        run = self.running
        if not run:
            return
        B = len(run)
        ids = torch.tensor([[s.out[-1]] for s in run], dtype=torch.int64)
        positions = torch.tensor([[s.ctx_len - 1] for s in run], dtype=torch.int64)
        slots = torch.tensor([s.slot for s in run], dtype=torch.int64)
        lens = torch.ones(B, dtype=torch.int64)
        ctx = torch.tensor([s.ctx_len for s in run], dtype=torch.int64)
        tables = self._tables[slots, :self.pool.blocks_for(int(ctx.max()))]
        view = int(slots.max()) + 1
        logits = self.runner.run(Step(ids, positions, slots, lens, ctx, view, tables))
        for s in run:
            s.computed = s.ctx_len
            self.pool.commit(s.kv, s.tokens, s.computed)
        self._advance(list(run), logits)

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """The output stage takes the step's tokens; the scheduler frees what finished."""
        done = self.output.advance(seqs, logits)
        if done:
            for s in done:
                self._release(s)
            ids = {s.id for s in done}
            self.running = [s for s in self.running if s.id not in ids]
