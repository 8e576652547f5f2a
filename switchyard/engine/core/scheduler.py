"""Rank 0's scheduler: continuous batching over a paged KV cache.

New requests wait in a bounded queue; between decode steps they are admitted (prefilled together, right-
padded) while decode slots are free, then join the running batch. At admission a request takes the longest
cached run of its prompt's leading blocks (automatic prefix caching, see kv_blocks) and prefills only the
rest. Blocks are taken as each step needs them; when the pool runs out, the most recently admitted
sequence is preempted: its blocks are freed (the full ones stay cached) and it goes back to the front of
the queue, to be prefilled again, prompt and output so far, when there is room (vLLM's recompute). Each
step, block tables included, is broadcast to the other ranks before it runs. A collective failure stops
everything (fail-stop): every open request gets an error and the process exits non-zero.

Async decode (`overlap`, as vLLM's async scheduling; docs/engine.md has why each step is safe): on one
rank, with a decoder that decodes in slot space (the torch and cuda backends), decode step n+1 is launched
before step n's tokens are read, its ids taken on the device from step n's sampled tokens; then step n's
tokens go through the output stage while step n+1 runs, and step n+1's sampling (its grammar masks filled
now) is queued behind it. A sequence that finishes at step n still has a row in step n+1, computed and
dropped; its blocks are freed after that launch (the device runs in launch order) and keyed for the prefix
cache only up to the tokens read. A step runs synchronously instead (the step in flight finished first)
with TP > 1, without slot-space decode (the cpu backend), when it prefills, and when its blocks cannot be
reserved without a preemption.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading

import torch

from switchyard.engine.affinity import Layout, pin_this_thread, unpin_this_thread
from switchyard.engine.backends.transfer import upload
from switchyard.engine.chat.tokenizer import ChatTokenizer, Detokenizer
from switchyard.engine.core.kv_blocks import BlockPool
from switchyard.engine.core.output import OutputStage, Sampled
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
                 max_num_batched_tokens: int = 512, pool: BlockPool | None = None, overlap: bool = True) -> None:
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
        self.pool = pool or BlockPool(runner.num_kv_blocks if runner is not None  # rank 0 passes its options' pool
                                      else max_num_seqs * -(-max_model_len // 16), 16)
        bs = self.pool.block_size
        # Each decode slot's block table, kept up to date: a step's tables are one index_select.
        self._tables = torch.zeros(max_num_seqs, -(-max_model_len // bs), dtype=torch.int64)
        self._admissions = itertools.count(1)
        self._aborted: set[int] = set()
        self._cv = threading.Condition()
        self._stop = False
        self.failed: str | None = None
        self.pinned: Layout | None = None  # where pin() put the loop thread and the fill process (/health's cpus)
        self.output = OutputStage(tokenizer, max_model_len, runner.opts.fill_threads if runner is not None else 1,
                                  runner is not None and runner.opts.fill_process, max_num_seqs)
        self.stats = self.output.stats  # counters the output stage and the scheduler share
        # Async decode (see the module's docstring), where it can hold.
        self.overlap = overlap and can_overlap(runner)
        self._inflight: Sampled | None = None  # a decode step launched, its tokens not read yet

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
        before = self.pin() if self.runner is not None and self.runner.opts.pins_cpus else None
        try:
            with torch.inference_mode():
                while self.step(wait=True):
                    pass
            self.runner.signal(STOP)
        except BaseException as e:
            self.fail(f"{type(e).__name__}: {e}")
            raise
        finally:
            self.output.close()
            if before is not None:
                unpin_this_thread(before)

    def pin(self) -> set[int] | None:
        """The calling thread (the loop's) on a core of its own, and the grammar fill process, once made, on
        the others (engine/affinity.py, --pin-cpus); returns the thread's CPUs before, or None where there
        was no layout to take (fewer than three cores)."""
        pinned = pin_this_thread()
        if pinned is None:
            return None
        layout, before = pinned
        self.pinned = layout
        self.output.fill_cpus = layout.fill
        log.info("loop thread on cpu %d, grammar fill on cpus %s", layout.engine, layout.fill)
        return before

    def step(self, wait: bool = False) -> bool:
        """One turn of the engine loop: admit what fits, then a prefill step or a decode step
        (async: launch decode step n+1, then finish step n). False once stopped. With nothing to
        do it waits for work up to the heartbeat when `wait`, then sends a heartbeat. (The GPU
        bench drives this, not a copy of it.)"""
        with self._cv:
            self._drop_aborted()
            if self._stop:
                return False
            idle = not (self.waiting or self.running or self.prefilling) and self._inflight is None
            if idle and wait:
                self._cv.wait(self.heartbeat_s)
                idle = not self.waiting and not self.running and not self._stop
            self._admit()
        if idle:
            self.runner.signal(HEARTBEAT)
            return True
        prefilled = False
        if self.prefilling:
            self._drain()  # a step that prefills runs synchronously
            # A prompt that finds no blocks (older sequences hold them) waits: decode goes on.
            prefilled = self._prefill()
        # Unchunked, new prompts go first (as before); chunked, every step also decodes.
        if self.running and (self.chunk or not prefilled):
            if self.overlap:
                self._decode_async()
            else:
                self._decode()
        else:
            self._drain()
        return True

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
                    s.finished = True  # a token in flight for it is dropped
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
        self._advance(done, logits, done_rows)
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
        logits = self.runner.run(Step(ids, positions, slots, lens, ctx, view, tables, keep_logits=False))  # sampled below
        for s in run:
            s.computed = s.ctx_len
            self.pool.commit(s.kv, s.tokens, s.computed)
        self._advance(list(run), logits)

    def _decode_async(self) -> None:
        """Launch the next decode step, its ids taken on the device from the step in flight (none:
        from the host, as a synchronous step), then finish the step in flight while the new one
        runs, then queue the new step's sampling. Falls back to a synchronous step when a row's
        next block needs a preemption."""
        prev = self._inflight
        run = self.running
        if prev is not None and [s.id for s in run] != [s.id for s in prev.seqs if not s.finished]:
            self._drain()  # not expected (only aborts leave a step in flight's rows), but safe
            prev = None
        # Each row's next position: the tokens read so far, and the one in flight.
        n = [s.ctx_len + s.inflight for s in run]
        for s in sorted(run, key=lambda s: s.admitted):
            had = len(s.kv.table)
            if not self.pool.grow(s.kv, s.ctx_len + s.inflight):
                # Short of blocks: the synchronous step decides whom to preempt, on tokens read.
                self._drain()
                self._decode()
                return
            self._sync_table(s, had)
        B = len(run)
        if prev is None:
            ids = torch.tensor([[s.out[-1]] for s in run], dtype=torch.int64)
        else:
            keep = [j for j, s in enumerate(prev.seqs) if not s.finished]
            toks = prev.tokens if len(keep) == len(prev.seqs) else \
                prev.tokens.index_select(0, upload(keep, torch.int64, prev.tokens.device))
            ids = toks.view(B, 1)
        ctx = torch.tensor(n, dtype=torch.int64)
        slots = torch.tensor([s.slot for s in run], dtype=torch.int64)
        tables = self._tables[slots, :self.pool.blocks_for(max(n))]
        logits = self.runner.run(Step(ids, (ctx - 1).view(B, 1), slots, torch.ones(B, dtype=torch.int64), ctx,
                                      int(slots.max()) + 1, tables, keep_logits=False))  # sampled below, before the next
        self._inflight = None
        for s, k in zip(run, n, strict=True):
            s.computed = k
        if prev is not None:
            self._finish(prev)  # step n's tokens and output, while step n+1 runs
        live = [i for i, s in enumerate(run) if not s.finished]
        if not live:
            return
        seqs = [run[i] for i in live]
        self._inflight = self.output.sample(seqs, logits, live)
        for s in seqs:
            s.inflight = 1

    def _finish(self, sampled: Sampled) -> None:
        """A step in flight's tokens through the output stage; its rows' blocks keyed up to the
        tokens now known; the finished freed."""
        done = self.output.finish(sampled)
        for s in sampled.seqs:
            s.inflight = 0
            if s.kv.table:
                self.pool.commit(s.kv, s.tokens, min(s.computed, s.ctx_len))
        self._free(done)

    def _drain(self) -> None:
        """Finish the step in flight, if any (what a synchronous step needs first)."""
        prev, self._inflight = self._inflight, None
        if prev is not None:
            self._finish(prev)

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor, rows: list[int] | None = None) -> None:
        """The output stage takes the step's tokens (seqs[i]'s from logits row rows[i]); the
        scheduler frees what finished."""
        self._free(self.output.finish(self.output.sample(seqs, logits, rows)))

    def _free(self, done: list[Sequence]) -> None:
        if done:
            for s in done:
                self._release(s)
            ids = {s.id for s in done}
            self.running = [s for s in self.running if s.id not in ids]


def can_overlap(runner: Runner | None) -> bool:
    """Whether async decode can hold for this runner: one rank, slot-space decode."""
    model = getattr(runner, "model", None)
    return runner is not None and runner.world == 1 and getattr(model, "graph_runner", None) is not None
