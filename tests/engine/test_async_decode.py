"""Async decode (core/scheduler.py): decode step n+1 launched with its ids taken on the device from
step n's sampled tokens, step n's tokens read and streamed while step n+1 runs. Through the real
scheduler and runner with the real SmolLM2 weights, on the path a GPU runs (the torch backend's
slot-space decode, here on the CPU with graphs off; the cuda backend's Triton kernels,
interpreted, on a narrow random model): every request's tokens, text, logprobs, finish reason and
usage must equal the synchronous loop's, with sequences stopping on EOS, a stop string and
max_tokens mid-batch while others continue, seeded sampling with logprobs, grammar-constrained
rows beside free ones, preemption under a small pool, and an abort."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from switchyard.engine.affinity import unpin_this_thread
from switchyard.engine.chat.tokenizer import ChatTokenizer
from switchyard.engine.core.kv_blocks import BlockPool
from switchyard.engine.core.sampling import SamplingParams
from switchyard.engine.core.scheduler import Scheduler, can_overlap
from switchyard.engine.core.sequence import Sequence
from switchyard.engine.model.step import Step
from switchyard.engine.runner.model_runner import Runner
from switchyard.engine.runner.options import EngineOptions

MAX_SEQS, MAX_LEN = 4, 256
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["city", "days"]}


def _slot_space(r: Runner, backend: str) -> Runner:
    """The runner's decoder on a slot-space backend (a GPU's path), graphs off: the served CPU
    backend decodes eagerly and never overlaps."""
    m = r.model
    assert m is not None
    m.backend_name = backend
    m.allocate_cache(m.max_slots, m.max_len, m.num_blocks)  # the spare block and the graph runner
    assert m.graph_runner is not None and not m.graph_runner.graphs.enabled
    return r


@pytest.fixture(scope="module")
def smollm2(gguf_path: Path) -> tuple[Runner, ChatTokenizer]:
    """SmolLM2's real weights in float32, one thread (a busy 2-core machine), torch backend."""
    from switchyard.engine.chat import tokenizer

    r = Runner(EngineOptions(model_path=gguf_path, device="cpu", dtype="float32", max_num_seqs=MAX_SEQS,
                             max_model_len=MAX_LEN, threads=1), 0, 1)
    r.setup()
    return _slot_space(r, "torch"), tokenizer.from_gguf(r.source.reader)


@dataclasses.dataclass
class Run:
    """What each request's client saw, and how the loop ran."""

    outs: list[list[int]]
    events: list[list[dict[str, Any]]]
    overlapped: int  # decode steps launched while another step's tokens were still unread
    sched: Scheduler

    def text(self, i: int) -> str:
        return "".join(e.get("text", "") for e in self.events[i] if e["type"] == "delta")

    def finish(self, i: int) -> dict[str, Any] | None:
        return next((e for e in self.events[i] if e["type"] == "finish"), None)


def drive(runner: Runner, tok: ChatTokenizer, requests: list[tuple[list[int], SamplingParams, Any]], overlap: bool,
          pool: BlockPool | None = None, abort: tuple[int, int] | None = None,
          after: Callable[[Scheduler, list[Sequence]], None] | None = None, ahead: bool = False,
          threads: int = 1, process: bool = False, pin: bool = False) -> Run:
    """Submit the requests (prompt, params, grammar) at once and step the scheduler until every one
    finished (or, abort = (request, tokens), that request was aborted once it had that many).
    ahead: grammar masks filled ahead on the masker's thread (as GPU logits get them; here the
    waiting kernel is interpreted on the CPU logits), by llguidance's pool of `threads` if more than one;
    process: filled by a process of their own (the output stage's own choice, as --grammar-fill process);
    pin: this thread and that process pinned first (Scheduler.pin, as a GPU replica's loop under --pin-cpus
    on), unpinned at the end."""
    sched = Scheduler(runner, tok, MAX_SEQS, runner.max_model_len, pool=pool, overlap=overlap)
    unpin = sched.pin() if pin else None
    if process:
        sched.output.grammar_process, sched.output.grammar_threads = True, threads
    if ahead:
        from switchyard.engine.chat.grammar import GrammarMasker

        sched.output.masker = GrammarMasker(tok.vocab_size, threads=threads, ahead=True)
    assert sched.overlap == overlap
    events: list[list[dict[str, Any]]] = [[] for _ in requests]
    seqs = []
    for i, (prompt, params, grammar) in enumerate(requests):
        s = Sequence(prompt=list(prompt), params=params, sink=events[i].append, grammar=grammar)
        sched.submit(s)
        seqs.append(s)
    overlapped = 0
    real_run = runner.run

    def spy(step: Step) -> torch.Tensor:
        nonlocal overlapped
        overlapped += step.T == 1 and sched._inflight is not None
        return real_run(step)

    runner.run = spy  # type: ignore[method-assign]
    aborted = False
    try:
        with torch.inference_mode():
            for _ in range(400):
                if abort is not None and not aborted and len(seqs[abort[0]].out) >= abort[1]:
                    sched.abort(seqs[abort[0]].id)
                    aborted = True
                if all(any(e["type"] == "finish" for e in ev) or (aborted and i == abort[0])  # type: ignore[index]
                       for i, ev in enumerate(events)) and sched._inflight is None:
                    break
                sched.step()
            else:
                raise AssertionError("the requests did not finish in 400 steps")
            if after is not None:
                after(sched, seqs)
    finally:
        del runner.run
        if unpin is not None:
            unpin_this_thread(unpin)
    return Run([list(s.out) for s in seqs], events, overlapped, sched)


def _chat(tok: ChatTokenizer, text: str) -> list[int]:
    return tok.encode(tok.render([{"role": "user", "content": text}]))


def assert_same(sync: Run, fast: Run, skip: set[int] = frozenset()) -> None:  # type: ignore[assignment]
    for i in range(len(sync.outs)):
        if i in skip:
            continue
        assert fast.outs[i] == sync.outs[i], i
        assert fast.text(i) == sync.text(i), i
        assert fast.finish(i) == sync.finish(i), i
        lp_sync = [e.get("logprobs") for e in sync.events[i]]
        lp_fast = [e.get("logprobs") for e in fast.events[i]]
        assert [x for x in lp_fast if x] == [x for x in lp_sync if x], i


def _pool_is_empty(sched: Scheduler) -> None:
    sched.pool.check()
    assert sched.pool.num_free == sched.pool.num_blocks and sorted(sched.free_slots) == list(range(MAX_SEQS))


def test_greedy_stops_mid_batch_equal_the_synchronous_loop(smollm2: tuple[Runner, ChatTokenizer]) -> None:
    """EOS, a stop string and max_tokens end three requests at different steps while the others
    go on (the rows leave slots 1 and 2 free under a step in flight: the ids are scattered into
    the slots that remain); then a follow-up turn is served from the first turn's cached blocks."""
    r, tok = smollm2
    greedy = dict(temperature=0.0)
    reqs = [(_chat(tok, "Write a story about a cat."), SamplingParams(max_tokens=14, **greedy), None),
            (_chat(tok, "What is 2+2?"), SamplingParams(max_tokens=40, **greedy), None),  # EOS after 11 tokens
            (_chat(tok, "List three colors."), SamplingParams(max_tokens=30, stop=["Red"], **greedy), None),
            (_chat(tok, "Say hello."), SamplingParams(max_tokens=19, **greedy), None)]
    turns: dict[bool, list[int]] = {}

    def follow_up(overlap: bool) -> Callable[[Scheduler, list[Sequence]], None]:
        def run(sched: Scheduler, seqs: list[Sequence]) -> None:
            _pool_is_empty(sched)
            events: list[dict[str, Any]] = []
            nxt = Sequence(prompt=seqs[0].prompt + seqs[0].out + _chat(tok, "Go on.")[1:],
                           params=SamplingParams(max_tokens=6, temperature=0.0), sink=events.append)
            sched.submit(nxt)
            while not any(e["type"] == "finish" for e in events) or sched._inflight is not None:
                sched.step()
            assert nxt.cached_tokens >= 32
            turns[overlap] = [nxt.cached_tokens, *nxt.out]
        return run

    sync = drive(r, tok, reqs, overlap=False, after=follow_up(False))
    fast = drive(r, tok, reqs, overlap=True, after=follow_up(True))
    assert sync.overlapped == 0 and fast.overlapped >= 20
    assert [sync.finish(i)["reason"] for i in range(4)] == ["length", "stop", "stop", "length"]  # type: ignore[index]
    assert "Red" not in sync.text(2) and len(sync.outs[1]) < 40
    assert_same(sync, fast)
    assert turns[True] == turns[False]


def test_seeded_sampling_and_logprobs_equal_the_synchronous_loop(smollm2: tuple[Runner, ChatTokenizer]) -> None:
    r, tok = smollm2
    reqs = [(_chat(tok, "Tell me a joke."),
             SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=7, logprobs=True, top_logprobs=3), None),
            (_chat(tok, "Name a fruit."), SamplingParams(max_tokens=8, temperature=0.0, logprobs=True), None),
            (_chat(tok, "Describe rain."), SamplingParams(max_tokens=12, temperature=1.2, seed=3), None)]
    sync = drive(r, tok, reqs, overlap=False)
    fast = drive(r, tok, reqs, overlap=True)
    assert fast.overlapped >= 8
    assert_same(sync, fast)
    lps = [x for e in fast.events[0] for x in e.get("logprobs", [])]
    assert len(lps) == len(fast.outs[0]) and all(len(x["top"]) == 3 for x in lps)


def test_grammar_rows_beside_free_rows_equal_the_synchronous_loop(smollm2: tuple[Runner, ChatTokenizer],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Constrained rows' masks for step n+1 are filled after step n's tokens were accepted, while
    step n+1 runs (in line, ahead on the masker's thread, ahead by a pool over two lanes, a GPU
    replica's form, and by a process of their own, --grammar-fill process); the output, and where the
    structure completes, are the synchronous loop's."""
    from switchyard.engine.chat.grammar import GrammarMasker, Grammars
    from switchyard.engine.chat.structured import constraint

    r, tok = smollm2
    grammars = Grammars(tok.tok.to_str(), tok.vocab_size, sorted(tok.eos_ids))
    rf = {"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}}

    def reqs(g: Grammars = grammars) -> list[tuple[list[int], SamplingParams, Any]]:  # fresh matchers each run
        return [(_chat(tok, "Weather in Paris for 3 days, as JSON."),
                 SamplingParams(max_tokens=40, temperature=0.0), g.compile(constraint(rf, None))),
                (_chat(tok, "Say hello."), SamplingParams(max_tokens=16, temperature=0.0), None),
                (_chat(tok, "A city in Peru and a number of days, as JSON."),
                 SamplingParams(max_tokens=40, temperature=0.7, seed=5), g.compile(constraint(rf, None)))]

    sync = drive(r, tok, reqs(), overlap=False)
    fast = drive(r, tok, reqs(), overlap=True)
    assert fast.overlapped >= 10
    assert_same(sync, fast)
    # The masks filled ahead (the served form on a GPU): the same output, step after step.
    ahead = drive(r, tok, reqs(), overlap=True, ahead=True)
    assert ahead.overlapped >= 10 and ahead.sched.output.masker._filler is not None  # type: ignore[union-attr]
    assert ahead.sched.output.masker._filler.ticket >= 10  # type: ignore[union-attr]
    assert_same(sync, ahead)
    # A pool of two over two lanes (each request's grammar compiled for its lane), its two rows enough here.
    monkeypatch.setattr(GrammarMasker, "PAR_ROWS", 2)
    lanes = Grammars(tok.tok.to_str(), tok.vocab_size, sorted(tok.eos_ids), lanes=2)
    pooled = drive(r, tok, reqs(lanes), overlap=True, ahead=True, threads=2)
    assert lanes.compiled == 2 and pooled.sched.output.masker.executor is not None  # type: ignore[union-attr]
    assert pooled.sched.output.masker._filler.ticket >= 10  # type: ignore[union-attr]
    assert_same(sync, pooled)
    # Filled by a process of their own (--grammar-fill process, chat/grammar_process): its mirror matchers,
    # handed each step's tokens early by the output stage, give the same masks step after step. Pinned as a
    # GPU replica's loop pins it under --pin-cpus on (this machine may have two cores: the layout given).
    import os

    from switchyard.engine import affinity
    from switchyard.engine.chat.grammar_process import ProcessMasker

    before = os.sched_getaffinity(0)
    first, *rest = sorted(before)
    if rest:
        monkeypatch.setattr(affinity, "pinned_layout", lambda cpus: affinity.Layout(first, rest))
    processed = drive(r, tok, reqs(), overlap=True, threads=2, process=True, pin=bool(rest))
    masker = processed.sched.output.masker
    try:
        assert os.sched_getaffinity(0) == before  # unpinned at the end
        if rest:
            assert os.sched_getaffinity(masker.proc.pid) == set(rest)  # type: ignore[union-attr]
        assert isinstance(masker, ProcessMasker) and masker.ticket >= 10 and masker.proc.is_alive()
        assert masker._early >= masker.ticket - 2  # each step's tokens went early (all but the first's)
        assert_same(sync, processed)
    finally:
        masker.close()  # type: ignore[union-attr]
    import json

    for i in (0, 2):
        assert fast.finish(i)["reason"] == "stop"  # type: ignore[index]
        assert set(json.loads(fast.text(i))) == {"city", "days"}


def test_preemption_under_a_small_pool_equals_the_synchronous_loop(smollm2: tuple[Runner, ChatTokenizer]) -> None:
    """12 blocks of 16 for four growing sequences: the youngest are preempted (a step that needs a
    preemption runs synchronously) and recomputed, and every answer is the synchronous loop's."""
    r, tok = smollm2
    reqs = [(_chat(tok, f"Count from {k} to {k + 30}, one number a line."),
             SamplingParams(max_tokens=36, temperature=0.0, ignore_eos=True), None) for k in (1, 5, 9, 13)]
    sync = drive(r, tok, reqs, overlap=False, pool=BlockPool(12, 16))
    fast = drive(r, tok, reqs, overlap=True, pool=BlockPool(12, 16))
    assert sync.sched.stats["preemptions"] > 0 and fast.sched.stats["preemptions"] > 0
    assert fast.overlapped >= 10
    assert_same(sync, fast)
    _pool_is_empty(fast.sched)


def test_an_abort_with_a_token_in_flight_drops_it(smollm2: tuple[Runner, ChatTokenizer]) -> None:
    """A request aborted while a step with its row is in flight: that token is never streamed, its
    blocks and slot are freed, and the others answer as the synchronous loop does."""
    r, tok = smollm2
    reqs = [(_chat(tok, "Write a story about a dog."), SamplingParams(max_tokens=16, temperature=0.0), None),
            (_chat(tok, "Write a poem about the sea."), SamplingParams(max_tokens=40, temperature=0.0), None),
            (_chat(tok, "Say hello."), SamplingParams(max_tokens=12, temperature=0.0), None)]
    sync = drive(r, tok, reqs, overlap=False, abort=(1, 5))
    fast = drive(r, tok, reqs, overlap=True, abort=(1, 5))
    assert_same(sync, fast, skip={1})
    assert fast.finish(1) is None and 5 <= len(fast.outs[1]) <= 7
    assert fast.outs[1] == sync.outs[1][:len(fast.outs[1])]
    streamed = tok.decode(fast.outs[1])
    assert streamed.startswith(fast.text(1))
    _pool_is_empty(fast.sched)


def test_overlap_only_where_it_holds(smollm2: tuple[Runner, ChatTokenizer]) -> None:
    """TP > 1 (the followers need the ids on the host) and an eager decoder (the cpu backend) stay
    synchronous; so does a scheduler asked not to overlap."""
    r, tok = smollm2
    assert can_overlap(r)
    assert not Scheduler(r, tok, MAX_SEQS, MAX_LEN, overlap=False).overlap

    class Fake:
        world, model = 2, r.model

    assert not can_overlap(Fake())  # type: ignore[arg-type]
    Fake.world, Fake.model = 1, dataclasses.make_dataclass("Eager", [("graph_runner", object)])(None)
    assert not can_overlap(Fake())  # type: ignore[arg-type]
    assert not can_overlap(None)


fused = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (dev extra)")


@fused
def test_cuda_backend_async_equals_sync(smollm2: tuple[Runner, ChatTokenizer]) -> None:
    """The cuda backend's Triton decode kernels (interpreted without a GPU) under async decode, on
    a narrow random Llama: the same tokens as its synchronous loop."""
    from switchyard.engine.model.decoder import Decoder
    from switchyard.engine.model.random_weights import SMOLLM2_135M, random_weights
    from switchyard.engine.model.weights import Shard
    from switchyard.engine.runner.comm import SingleRank

    _, tok = smollm2
    cfg = dataclasses.replace(SMOLLM2_135M, vocab_size=1024, hidden_size=128, intermediate_size=256, num_heads=4,
                              num_kv_heads=2, head_dim=32, num_layers=2)
    r = Runner(EngineOptions(model_path=Path("narrow"), device="cpu", max_num_seqs=MAX_SEQS, max_model_len=64), 0, 1)
    r.config = cfg
    r.model = Decoder(cfg, Shard(0, 1, cfg), random_weights(cfg, seed=2), SingleRank(), max_slots=MAX_SEQS, max_len=64,
                      device="cpu", dtype="float32", backend="cuda", cuda_graphs=False)
    r.num_kv_blocks = r.model.num_blocks
    assert r.model.backend.name == "cuda" and can_overlap(r)
    g = torch.Generator().manual_seed(0)
    reqs = [(torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist(),
             SamplingParams(max_tokens=k, temperature=0.0, ignore_eos=True), None) for n, k in ((9, 5), (4, 7))]
    sync = drive(r, tok, reqs, overlap=False)
    fast = drive(r, tok, reqs, overlap=True)
    assert fast.overlapped >= 4
    assert_same(sync, fast)


# -- GPU ------------------------------------------------------------------------------------


class Letters:
    """A stand-in tokenizer for random weights: each id spells a letter."""

    eos_ids: set[int] = set()

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
@pytest.mark.parametrize("backend", ["cuda", "torch"])
def test_gpu_async_equals_sync_in_graphs(backend: str) -> None:
    """On a GPU, decode steps replayed as CUDA graphs, their ids copied on the device from the
    previous step's tokens, sampling and logprobs on the device: bit-identical to the synchronous
    loop (bf16, random SmolLM2-shaped weights), with seeded sampling and logprobs; on the torch
    backend also with sequences ending mid-batch, an abort with a token in flight and preemption.

    The cuda backend's fused GEMVs pick their tiles by the step's padded row count (one row: the
    whole reduction in one load; more: tl.dot over 256-element slices), so in bf16 a row's logits
    depend on how many rows share its step, as cuBLAS's do. Async decode keeps a finished row in
    the step after it ended, so where the batch shrinks the two loops run different row counts for
    a step and a near tie can flip (seen on an H200: one of six sequences). The cuda case keeps
    every row to the same length, so both loops run the same steps."""
    from switchyard.engine.model.decoder import Decoder
    from switchyard.engine.model.random_weights import SMOLLM2_135M, random_weights
    from switchyard.engine.model.weights import Shard
    from switchyard.engine.runner.comm import SingleRank

    cfg = dataclasses.replace(SMOLLM2_135M, num_layers=6)
    r = Runner(EngineOptions(model_path=Path("random"), device="cuda", max_num_seqs=8, max_model_len=MAX_LEN), 0, 1)
    r.config = cfg
    r.model = Decoder(cfg, Shard(0, 1, cfg), random_weights(cfg, seed=3, device="cuda"), SingleRank(), max_slots=8,
                      max_len=MAX_LEN, device="cuda", backend=backend)
    r.model.warmup()
    assert r.model.backend.name == backend and r.model.graph_runner.graphs.enabled  # type: ignore[union-attr]
    r.num_kv_blocks = r.model.num_blocks
    g = torch.Generator().manual_seed(1)
    tok = Letters()

    def reqs(n: int) -> list[tuple[list[int], SamplingParams, Any]]:
        out = []
        for i in range(n):
            kw: dict[str, Any] = {"temperature": 0.0}
            if i % 3 == 1:
                kw = {"temperature": 0.9, "top_p": 0.8, "seed": i, "logprobs": True, "top_logprobs": 2}
            elif i % 3 == 2:
                kw["logprobs"] = True
            out.append((torch.randint(3, cfg.vocab_size, (5 + 7 * i,), generator=g).tolist(),
                        SamplingParams(max_tokens=6 + 5 * i, ignore_eos=True, **kw), None))
        return out

    if backend == "cuda":  # the same row count in every step of both loops (see above)
        same = [(ids, dataclasses.replace(sp, max_tokens=24), x) for ids, sp, x in reqs(6)]
        sync = drive(r, tok, same, overlap=False)  # type: ignore[arg-type]
        fast = drive(r, tok, same, overlap=True)  # type: ignore[arg-type]
        assert fast.overlapped >= 20
        assert_same(sync, fast)
        _pool_is_empty(fast.sched)
        return
    batch = reqs(6)
    sync = drive(r, tok, batch, overlap=False, abort=(3, 4))  # type: ignore[arg-type]
    fast = drive(r, tok, batch, overlap=True, abort=(3, 4))  # type: ignore[arg-type]
    assert fast.overlapped >= 20
    assert_same(sync, fast, skip={3})
    assert fast.outs[3] == sync.outs[3]
    small = reqs(4)
    sync = drive(r, tok, small, overlap=False, pool=BlockPool(6, 16))  # type: ignore[arg-type]
    fast = drive(r, tok, small, overlap=True, pool=BlockPool(6, 16))  # type: ignore[arg-type]
    assert sync.sched.stats["preemptions"] > 0 and fast.sched.stats["preemptions"] > 0
    assert_same(sync, fast)
    _pool_is_empty(fast.sched)
