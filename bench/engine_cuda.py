"""Engine on one GPU: decode tokens/s (batch 1..256), TTFT (1k, 8k prompts), ours vs
transformers `generate` (static cache) on the same random bf16 weights, and the fraction of
the memory-bandwidth limit reached at batch 1.

  python bench/engine_cuda.py --out bench/results            # both shapes, CUDA
  python bench/engine_cuda.py --shapes smollm2-135m --batches 1,4 --tokens 8 --device cpu  # smoke
  python bench/engine_cuda.py --grammar-batches 1,16 --sweep ...   # + masks on; + bench_cuda_sweep's knobs
  python bench/engine_cuda.py --shapes llama-8b --batches 1 --ttft= --ttft-fp8 8192   # FP8 prefill vs bf16

Weights are random, made on the device, with the real models' shapes (SmolLM2-135M and an
8B Llama); speed depends on the shapes only. Our engine is timed through the loop it serves
with: the runner and core/scheduler.py's Scheduler.step (admission, prefill, decode steps, the
output stage: sampling on the GPU, detokenising, stop checks), greedy, EOS ignored, with async
decode (step n+1 launched with its ids taken on the device from step n's tokens, step n read
and finished while step n+1 runs) and, as a row of its own, without it (each step's tokens
read before the next is launched). Detokenising uses SmolLM2's tokenizer where `bash
bench/gpu_check.sh prepare` wrote it (else a stand-in); HTTP is not included. With
--grammar-batches, the same loop with every row under a JSON-schema grammar (llguidance over
SmolLM2's tokenizer, masks padded to the 8B shape's vocabulary), beside the free figure; its
strings are under patterns, the worst case for llguidance (bench/grammar_fill_threads.py), and
--grammar-tools adds a tool call's grammar (plain strings) to the same rounds.

Bandwidth limit at batch 1 = measured device-to-device copy bandwidth (bytes read + written
per second) / bytes of weights one decode step reads.
"""

from __future__ import annotations

import argparse
import csv
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from switchyard.engine.affinity import unpin_this_thread  # noqa: E402
from switchyard.engine.backends.cuda.graphs import MIN_LEN_BUCKET  # noqa: E402
from switchyard.engine.core.sampling import SamplingParams  # noqa: E402
from switchyard.engine.core.scheduler import Scheduler  # noqa: E402
from switchyard.engine.core.sequence import Sequence  # noqa: E402
from switchyard.engine.model.config import ModelConfig  # noqa: E402
from switchyard.engine.model.decoder import Decoder, weight_bytes_per_token  # noqa: E402
from switchyard.engine.model.random_weights import SHAPES, random_weights  # noqa: E402
from switchyard.engine.model.step import Step  # noqa: E402
from switchyard.engine.model.weights import Shard  # noqa: E402
from switchyard.engine.runner.comm import SingleRank  # noqa: E402
from switchyard.engine.runner.model_runner import Runner  # noqa: E402
from switchyard.engine.runner.options import EngineOptions  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_cuda_grammar  # noqa: E402
from engine_cuda_grammar import grammar_factory, grammar_rounds  # noqa: E402
from engine_fp8 import fp8_ttft  # noqa: E402
from peer_compiled import peer_decode_rate  # noqa: E402

PROMPT = 128  # decode-sweep prompt length
WARM = 3  # decode tokens each sequence has before the clock starts (graph captures, the first async turn)
ROOT = Path(__file__).resolve().parents[1]

class Clock:
    def __init__(self, budget_s: float) -> None:
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        return self.end - time.monotonic()


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def copy_bandwidth(dev: torch.device, nbytes: int = 2 << 30, iters: int = 20) -> float:
    """Bytes read + written per second by a device-to-device copy."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev).fill_(1.0)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    sync(dev)
    t = time.perf_counter()
    for _ in range(iters):
        b.copy_(a)
    sync(dev)
    dt = (time.perf_counter() - t) / iters
    del a, b
    return 2 * nbytes / dt


def hf_model(c: ModelConfig, dev: torch.device) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    hc = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                     num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                     num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_eps,
                     rope_theta=c.rope_theta, max_position_embeddings=16384,
                     tie_word_embeddings=c.tie_embeddings, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    if isinstance(getattr(hc, "rope_parameters", None), dict):
        hc.rope_parameters = {**hc.rope_parameters, "rope_theta": c.rope_theta}
    hc._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if dev.type == "cuda" else torch.float32)
    try:
        with torch.device(dev):
            model = LlamaForCausalLM(hc).eval()
    finally:
        torch.set_default_dtype(old)
    g = torch.Generator(device=dev).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=dev, dtype=torch.float32).mul_(0.02))
    return model


def our_weights(model: Any, c: ModelConfig) -> dict[str, torch.Tensor]:
    w = {k.removeprefix("model."): v for k, v in model.state_dict().items()}
    if c.tie_embeddings:
        w.pop("lm_head.weight", None)
    return w


class Letters:
    """A stand-in tokenizer where SmolLM2's is not at hand: each id spells a letter."""

    eos_ids: set[int] = set()
    vocab_size = 1 << 30

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


class Wrapped:
    """SmolLM2's tokenizer for a model with a larger vocabulary: ids past its own decode modulo it
    (so that every token costs a real decode)."""

    def __init__(self, tok: Any) -> None:
        # tok: its tokenizers.Tokenizer, as a ChatTokenizer's (the grammar fill process reads its JSON)
        self.chat, self.tok, self.eos_ids, self.vocab_size = tok, tok.tok, tok.eos_ids, tok.vocab_size

    def decode(self, ids: list[int]) -> str:
        return self.chat.decode([i % self.vocab_size for i in ids])


def smollm2_tokenizer() -> Any | None:
    """SmolLM2's tokenizer (chat/tokenizer.ChatTokenizer) where gpu_check.sh prepare wrote it."""
    import os

    from switchyard.engine.chat import tokenizer

    for d in (os.environ.get("SWITCHYARD_TEST_TOKENIZER_DIR"), ROOT / ".cache" / "smollm2-tokenizer"):
        if d and (Path(d) / "tokenizer.json").exists():
            return tokenizer.from_hf_dir(Path(d), set())
    return None


def served_runner(m: Decoder) -> Runner:
    """The runner's step protocol (runner/model_runner.Runner) around a decoder built here."""
    r = Runner(EngineOptions(model_path=Path("random-weights"), device=m.device.type, max_num_seqs=m.max_slots,
                             max_model_len=m.max_len), 0, 1)
    r.model, r.config, r.num_kv_blocks, r.max_model_len = m, m.c, m.num_blocks, m.max_len
    return r


def decode_rate(m: Decoder, batch: int, tokens: int, vocab: int, *, overlap: bool = True, tok: Any = None,
                grammar: Any = None, mask_threads: int | None = None,
                on_step: Callable[[], None] | None = None) -> dict[str, float]:
    """`batch` prompts of PROMPT random tokens through the served engine's loop (Scheduler.step,
    not a copy of it), greedy, EOS ignored, each to WARM + `tokens` tokens: the decode rate from
    when every sequence has WARM tokens to the last token read while all `batch` rows ran. overlap:
    async decode (else each step's tokens are read before the next step is launched); grammar: a
    factory of each row's grammar state (masks on); mask_threads: llguidance's threads for the masks
    (None: the engine's default, runner/options.auto_grammar_threads, filled as served: a process on a
    GPU; a number: on a thread, GrammarMasker(threads=)); on_step: called after each of
    the scheduler's steps (a profiler's schedule)."""
    tok = tok or Letters()
    sched = Scheduler(served_runner(m), tok, m.max_slots, m.max_len, overlap=overlap)
    hi = min(vocab, tok.vocab_size)

    def requests() -> list[Sequence]:
        return [Sequence(prompt=torch.randint(3, hi, (PROMPT,)).tolist(), sink=lambda ev: None,
                         params=SamplingParams(max_tokens=WARM + tokens, temperature=0.0, ignore_eos=True),
                         grammar=grammar() if grammar is not None else None) for _ in range(batch)]
    seqs = requests()
    if grammar is not None and mask_threads is not None:
        from switchyard.engine.chat.grammar import GrammarMasker
        sched.output.masker = GrammarMasker(seqs[0].grammar.vocab_size or vocab, threads=mask_threads)
    # The ab's pinned variants: this thread and the fill process as a served loop pins them (--pin-cpus).
    unpin = sched.pin() if engine_cuda_grammar.PIN_ENGINE else None
    # after each turn: time, tokens so far, the fewest a row has, whether a row has finished
    marks: list[tuple[float, int, int, bool]] = []
    fills: list[float] = []
    readies: list[float] = []  # masks filled ahead: submission to ticket (0 in line), a step each as `fills`
    early: list[Any] = []  # a fill process's early hand-over: (to its pickup, consumes, fill done to ticket), s
    try:
        with torch.inference_mode():
            if grammar is not None and engine_cuda_grammar.WARM_GRAMMAR:
                # The ab's warm variants: a batch of the same grammar first, untimed, through the same scheduler
                # (its fill process, its lanes' lexers), as a served replica has filled earlier requests of a schema.
                warmup = requests()
                for s in warmup:
                    sched.submit(s)
                while not all(s.finished for s in warmup):
                    sched.step()
            for s in seqs:
                sched.submit(s)
            t0 = time.perf_counter()
            while not all(s.finished for s in seqs):
                sched.step()
                if on_step is not None:
                    on_step()
                n = [len(s.out) for s in seqs]
                marks.append((time.perf_counter(), sum(n), min(n), any(s.finished for s in seqs)))
                if grammar is not None and sched.output.masker is not None:
                    fills.append(sched.output.masker.last_fill_s)
                    readies.append(sched.output.masker.last_ready_s)
                    early.append(getattr(sched.output.masker, "last_early_s", None))
        sync(m.device)
    finally:
        sched.output.close()  # a fill process's, before the next decode's (as the served loop's end does)
        if unpin is not None:
            unpin_this_thread(unpin)
    k = next(i for i, mk in enumerate(marks) if mk[2] >= WARM)
    # The clock stops at the first turn a row finished on (a tool call's row may end early): later steps
    # run fewer rows, and a rate over them would not be batch `batch`'s.
    end = next((i for i, mk in enumerate(marks) if i > k and mk[3]), len(marks) - 1)
    (t1, n1, *_), (t2, n2, *_) = marks[k], marks[end]
    dt = max(t2 - t1, 1e-9)
    r = {"tok_s": (n2 - n1) / dt, "step_ms": dt / max(1, (n2 - n1) / batch) * 1000, "ready_s": t1 - t0}
    if fills:
        r["mask_ms"] = statistics.median(fills[k:] or fills) * 1000
    if any(readies):
        r["ready_ms"] = statistics.median(readies[k:] or readies) * 1000
    if any(e is not None and any(e) for e in early):
        for j, name in enumerate(("pickup_ms", "consume_ms", "gap_ms")):
            r[name] = statistics.median(e[j] for e in (early[k:] or early)) * 1000
    return r


def raw_decode_rate(m: Decoder, batch: int, tokens: int, vocab: int) -> dict[str, float]:
    """The loop before the scheduler's: Decoder.forward, argmax on the GPU and the tokens read
    back every step (no output stage): what the kernels and the graph replay alone allow."""
    ids = torch.randint(0, vocab, (batch, PROMPT))
    lens = torch.full((batch,), PROMPT, dtype=torch.int64)
    slots = torch.arange(batch)
    logits = m.forward(Step(ids, torch.arange(PROMPT).expand(batch, PROMPT).contiguous(), slots, lens, lens, 0))
    nxt = logits.argmax(-1).tolist()
    ctx = PROMPT
    one = torch.ones(batch, dtype=torch.int64)

    def step() -> None:
        nonlocal nxt, ctx
        logits = m.forward(Step(torch.tensor(nxt).view(batch, 1), torch.full((batch, 1), ctx), slots, one,
                           torch.full((batch,), ctx + 1), batch))
        nxt = logits.argmax(-1).tolist()
        ctx += 1

    for _ in range(WARM):
        step()
    sync(m.device)
    t = time.perf_counter()
    for _ in range(tokens):
        step()
    sync(m.device)
    dt = time.perf_counter() - t
    return {"tok_s": batch * tokens / dt, "step_ms": dt / tokens * 1000}


def ttft(m: Decoder, n: int, vocab: int, reps: int = 3) -> float:
    ids = torch.randint(0, vocab, (1, n))
    lens = torch.tensor([n])
    samples = []
    for _ in range(reps):
        sync(m.device)
        t = time.perf_counter()
        logits = m.forward(Step(ids, torch.arange(n).view(1, n), torch.tensor([0]), lens, lens, 0))
        int(logits.argmax(-1)[0])
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1000


def hf_generate(model: Any, batch: int, prompt: int, new: int, vocab: int) -> float:
    ids = torch.randint(2, vocab, (batch, prompt), device=model.device)
    kw: dict[str, Any] = {"do_sample": False, "cache_implementation": "static", "pad_token_id": 0,
                          "disable_compile": True}
    with torch.inference_mode():
        sync(model.device)
        t = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, **kw)
        sync(model.device)
    return time.perf_counter() - t


def shape_tokenizer(c: ModelConfig) -> Any:
    """What detokenises a shape's tokens: SmolLM2's tokenizer (ids past its vocabulary modulo it),
    else the stand-in."""
    tok = smollm2_tokenizer()
    if tok is None:
        return Letters()
    return Wrapped(tok) if c.vocab_size > tok.vocab_size else tok


def bench_shape(name: str, dev: torch.device, a: argparse.Namespace, clock: Clock, bw: float,
                log: Any) -> list[dict[str, Any]]:
    c = SHAPES[name]
    batches = ints(a.batches)
    grammar_batches = ints(a.grammar_batches)
    sweep_batches = ints(a.sweep_batches) if a.sweep else []
    tokens = a.tokens
    hf = not a.skip_transformers
    rows: list[dict[str, Any]] = []

    def add(engine: str, metric: str, batch: int, value: float, unit: str, note: str = "") -> None:
        rows.append({"shape": name, "engine": engine, "metric": metric, "batch": batch,
                     "value": round(value, 3), "unit": unit, "note": note})
        log(f"  {name:13} {engine:26} {metric:18} b={batch:<4} {value:10.2f} {unit} {note}")

    def decode(engine: str, m: Decoder, b: int, **kw: Any) -> dict[str, float]:
        r = decode_rate(m, b, tokens, c.vocab_size, tok=tok, **kw)
        note = f"step {r['step_ms']:.3f} ms"
        if "mask_ms" in r:
            note += f", mask fill {r['mask_ms']:.3f} ms"
        add(engine, "decode_tok_s", b, r["tok_s"], "tok/s", note)
        return r

    # The views share this decoder's cache: it holds the most rows any point runs (the graph-parts
    # sweep's too, or its batches queue for blocks and run a row at a time).
    parts_batches = ints(a.parts_batches) if sweep_batches else []
    t = time.perf_counter()
    model = hf_model(c, dev) if hf else None
    w = our_weights(model, c) if model is not None else random_weights(c, seed=0, device=dev, dtype=torch.bfloat16)
    fp8_prefill = bool(a.ttft_fp8) and dev.type == "cuda"  # the FP8 copies (--prefill-fp8), ~7 GB for 8B
    slots = max([1, *batches, *grammar_batches, *sweep_batches, *parts_batches])
    m = Decoder(c, Shard(0, 1, c), w, SingleRank(), max_slots=slots,
                max_len=max(2 * PROMPT, PROMPT + WARM + tokens + 16), device=dev, dtype=torch.bfloat16,
                cuda_graphs=True, backend="auto" if dev.type == "cuda" else "torch", prefill_fp8=fp8_prefill)
    del w
    tok = shape_tokenizer(c)
    log(f"{name}: weights made and loaded in {time.perf_counter() - t:.1f}s; "
        f"{weight_bytes_per_token(m) / 1e9:.3f} GB read per batch-1 step; detokenised by {type(tok).__name__}")
    t = time.perf_counter()
    decode_rate(m, 1, min(tokens, 8), c.vocab_size, tok=tok)  # compiles the fused ops
    log(f"  warm-up (compile + first graphs) {time.perf_counter() - t:.1f}s; {m.backend_name} backend, "
        f"ops {m.status().get('fused_ops')}")
    limit = bw / weight_bytes_per_token(m)
    for b in batches:
        if clock.left() < 45:
            log(f"  batch {b}: skipped (time)")
            break
        for engine, overlap in (("ours (async)", True), ("ours (sync)", False)):
            r = decode(engine, m, b, overlap=overlap)
            if b == 1:
                add(engine, "bw_limit_fraction", 1, r["tok_s"] / limit, "x",
                    f"limit {limit:.0f} tok/s at {bw / 1e12:.2f} TB/s")
        if b == 1:
            r = raw_decode_rate(m, 1, tokens, c.vocab_size)
            add("ours (raw loop)", "decode_tok_s", 1, r["tok_s"], "tok/s",
                f"step {r['step_ms']:.3f} ms: forward, argmax, read back; no output stage")
    if grammar_batches:
        gtok = smollm2_tokenizer()
        if gtok is None:
            log("  grammar: skipped (no SmolLM2 tokenizer: run `bash bench/gpu_check.sh prepare` and carry .cache)")
        else:
            make = grammar_factory(gtok)
            for b in grammar_batches:
                if clock.left() < 40:
                    log(f"  grammar batch {b}: skipped (time)")
                    break
                if a.grammar_rounds > 1:
                    grammar_rounds(decode_rate, m, b, make, a.grammar_rounds, a.grammar_ab, tokens, c.vocab_size,
                                   tok, add, log, grammar_factory(gtok, tool_calls=True) if a.grammar_tools else None,
                                   tuple(x for x in a.mask_threads_ab.split(",") if x) if b >= 4 else (), gtok,
                                   tuple(ints(a.switch_ab)), tuple(x for x in a.grammar_only.split(";") if x))
                    continue
                if b not in batches:
                    decode("ours (async)", m, b)
                decode("ours (async, grammar)", m, b, grammar=make)
                decode("ours (sync, grammar)", m, b, overlap=False, grammar=make)
                for pool in ints(a.mask_threads_ab) if b >= 4 else []:  # llguidance's pool, beside the served fill
                    decode(f"ours (async, grammar, pool of {pool})", m, b, grammar=make, mask_threads=pool)
    if sweep_batches and clock.left() > 60:
        from engine_cuda_sweep import BACKENDS, sweep

        sweep(m, c, sweep_batches, parts_batches, tokens, tok, clock, add, log, a.sweep_backends or BACKENDS,
              a.sweep_rounds)
    if 1 in batches and clock.left() > 20:  # the same weights, cache and backend, decode steps run eagerly
        decode("ours (no graphs)", m.view(m.backend_name, cuda_graphs=False, max_slots=m.max_slots), 1)
    if a.ttft and clock.left() > 15:
        lens = ints(a.ttft)
        m.allocate_cache(1, max(lens) + 16)
        ttft(m, min(lens), c.vocab_size, reps=1)  # warm-up
        for n in lens:
            add("ours", "ttft_ms", 1, ttft(m, n, c.vocab_size), "ms",
                f"prompt {n}" + (" (prefill fp8 from 4096 tokens)" if fp8_prefill else ""))
    if a.ttft_fp8 and clock.left() > 30:
        fp8_ttft(m, ttft, ints(a.ttft_fp8), c.vocab_size, a.fp8_rounds, a.fp8_prompts, add, log)
    del m
    gc.collect()
    # The compiled PyTorch peer (bench/peer_compiled.py) on its own weights of the same shape,
    # right after ours: the same device, clocks and run.
    for b in ints(a.peer_batches):
        if clock.left() < 45:
            log(f"  peer batch {b}: skipped (time)")
            break
        r = peer_decode_rate(c, dev, b, tokens)
        add("compiled peer", "decode_tok_s", b, r["tok_s"], "tok/s",
            f"step {r['step_ms']:.2f} ms, set-up {r['setup_s']:.0f} s")
    if model is not None and clock.left() > 40:
        ttft_lens = ints(a.ttft)
        hf_generate(model, 1, 16, 2, c.vocab_size)  # warm-up
        hf_generate(model, 1, min(ttft_lens or [PROMPT]), 1, c.vocab_size)
        for b in ints(a.hf_batches):
            if clock.left() < 25:
                break
            t1 = hf_generate(model, b, PROMPT, 1, c.vocab_size)
            tn = hf_generate(model, b, PROMPT, tokens + 1, c.vocab_size)
            add("transformers static", "decode_tok_s", b, b * tokens / max(tn - t1, 1e-9), "tok/s",
                "generate(cache_implementation='static'), not compiled")
        for n in ttft_lens:
            if clock.left() < 15:
                break
            add("transformers static", "ttft_ms", 1, hf_generate(model, 1, n, 1, c.vocab_size) * 1000, "ms",
                f"prompt {n}")
    del model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def summary(rows: list[dict[str, Any]], bw: float) -> str:
    def val(shape: str, engine: str, metric: str, batch: int) -> float | None:
        for r in rows:
            if (r["shape"], r["engine"], r["metric"], r["batch"]) == (shape, engine, metric, batch):
                return float(r["value"])
        return None

    def step(shape: str, engine: str, batch: int) -> float | None:
        for r in rows:
            if (r["shape"], r["engine"], r["metric"], r["batch"]) == (shape, engine, "decode_tok_s", batch):
                return float(r["note"].split()[1].rstrip(","))
        return None

    def n(v: float | None, fmt: str = ",.0f") -> str:
        return "" if v is None else format(v, fmt)

    def ratio(x: float | None, y: float | None) -> str:
        return "" if x is None or y is None or not y else f"{x / y:.2f}x"

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    lines = [f"Copy bandwidth (read + write): {bw / 1e12:.2f} TB/s", "",
             "Decode through the served loop (Scheduler.step: sampling on the GPU, detokenising, stop checks), "
             "with async decode and without:", "",
             "| shape | batch | ours async tok/s (step ms) | ours sync tok/s (step ms) | async / sync | "
             "compiled peer tok/s | ours async / peer | transformers tok/s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for shape in shapes:
        for b in sorted({r["batch"] for r in rows if r["shape"] == shape and r["engine"] == "ours (async)"}):
            o, sy = val(shape, "ours (async)", "decode_tok_s", b), val(shape, "ours (sync)", "decode_tok_s", b)
            p, h = val(shape, "compiled peer", "decode_tok_s", b), val(shape, "transformers static", "decode_tok_s", b)
            lines.append(f"| {shape} | {b} | {n(o)} ({n(step(shape, 'ours (async)', b), '.3f')}) | "
                         f"{n(sy)} ({n(step(shape, 'ours (sync)', b), '.3f')}) | {ratio(o, sy)} | {n(p)} | "
                         f"{ratio(o, p)} | {n(h)} |")
    lines += ["", "| shape | b1 async: fraction of the bandwidth limit | b1 sync | b1 raw loop tok/s (forward, argmax, "
              "read back) | b1 no graphs tok/s | b64 / b1 | TTFT ours (ms) | TTFT transformers (ms) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for shape in shapes:
        fa, fs = val(shape, "ours (async)", "bw_limit_fraction", 1), val(shape, "ours (sync)", "bw_limit_fraction", 1)
        b1, b64 = val(shape, "ours (async)", "decode_tok_s", 1), val(shape, "ours (async)", "decode_tok_s", 64)
        tt = ", ".join(f"{r['note'].split()[-1]}: {r['value']:.0f}" for r in rows
                       if r["shape"] == shape and r["engine"] == "ours" and r["metric"] == "ttft_ms")
        th = ", ".join(f"{r['note'].split()[-1]}: {r['value']:.0f}" for r in rows
                       if r["shape"] == shape and r["engine"] == "transformers static" and r["metric"] == "ttft_ms")
        lines.append(f"| {shape} | {n(fa, '.0%')} | {n(fs, '.0%')} | "
                     f"{n(val(shape, 'ours (raw loop)', 'decode_tok_s', 1))} | "
                     f"{n(val(shape, 'ours (no graphs)', 'decode_tok_s', 1))} | {ratio(b64, b1)} | {tt} | {th} |")
    f8 = [r for r in rows if r["engine"].startswith("ours (prefill ") and r["metric"] == "ttft_ms"]
    if f8:
        lines += ["", "TTFT with the prefill's projections in bf16 and in FP8 (--ttft-fp8: alternated rounds, "
                  "medians; top-1 of the last position against bf16's over random prompts):", "",
                  "| shape | variant | TTFT ms | / bf16 | last position against bf16 |",
                  "| --- | --- | --- | --- | --- |"]
        for r in f8:
            note = r["note"]
            lines.append(f"| {r['shape']} | {r['engine'][len('ours (prefill '):-1]}, {note.split(',')[0]} | "
                         f"{r['value']:.1f} | {note.split('; ')[1].split(' bf16')[0]} | {note.split('; ')[-1]} |")
    gram = [(r["shape"], r["batch"]) for r in rows if r["engine"] == "ours (async, grammar)"]
    if gram:
        lines += ["", "Grammar-constrained decoding (every row under a JSON-schema grammar, masks filled on the host "
                  "by llguidance and applied on the GPU), beside the free figure of the same run:", "",
                  "| shape | batch | free async tok/s | grammar async tok/s | grammar / free | grammar sync tok/s | "
                  "mask fill ms a step (host) |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for shape, b in gram:
            f, g = val(shape, "ours (async)", "decode_tok_s", b), val(shape, "ours (async, grammar)", "decode_tok_s", b)
            note = next(r["note"] for r in rows if (r["shape"], r["engine"], r["batch"]) ==
                        (shape, "ours (async, grammar)", b))
            fill = note.split("mask fill ")[-1] if "mask fill" in note else ""
            lines.append(f"| {shape} | {b} | {n(f)} | {n(g)} | {ratio(g, f)} | "
                         f"{n(val(shape, 'ours (sync, grammar)', 'decode_tok_s', b))} | {fill} |")
        ab = [r for r in rows if r["engine"].startswith("ours (async, ") and "pool" not in r["engine"]
              and r["engine"] != "ours (async, grammar)" and r["metric"] == "decode_tok_s"]
        if ab:  # --grammar-ab, --grammar-tools: other variants in the same rounds
            lines += ["", "The grammar's variants, alternated with the rows above (medians of the rounds):", "",
                      "| shape | batch | variant | tok/s | / free | / grammar (this tree) | step, fill |",
                      "| --- | --- | --- | --- | --- | --- | --- |"]
            for r in ab:
                sh, b = r["shape"], r["batch"]
                lines.append(f"| {sh} | {b} | {r['engine'][len('ours (async, '):-1]} | {n(r['value'])} | "
                             f"{ratio(r['value'], val(sh, 'ours (async)', 'decode_tok_s', b))} | "
                             f"{ratio(r['value'], val(sh, 'ours (async, grammar)', 'decode_tok_s', b))} | "
                             f"{r['note'].split(' (')[0]}" + (f"; {r['note'].split('), ')[-1]}" if "), " in r["note"]
                                                              else "") + " |")
        pool = [(r["shape"], r["batch"], r["engine"], r["value"]) for r in rows
                if r["engine"].startswith("ours (async, grammar, pool")]
        if pool:
            lines += ["", "The masks filled by llguidance's pool (--mask-threads-ab), against the served fill above:",
                      "", "| shape | batch | pool | grammar async tok/s | / served fill | / free |",
                      "| --- | --- | --- | --- | --- | --- |"]
            lines += [f"| {shape} | {b} | {e[len('ours (async, grammar, '):-1]} | {n(v)} | "
                      f"{ratio(v, val(shape, 'ours (async, grammar)', 'decode_tok_s', b))} | "
                      f"{ratio(v, val(shape, 'ours (async)', 'decode_tok_s', b))} |" for shape, b, e, v in pool]
    if any(r["engine"].startswith("sweep:") for r in rows):
        from engine_cuda_sweep import sweep_table

        lines += ["", sweep_table(rows)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Engine on one GPU (also: bench/engine.py --device cuda ...)")
    ap.add_argument("--shapes", default="smollm2-135m,llama-8b")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--hf-batches", default="1,64")
    ap.add_argument("--tokens", type=int, default=32, help="timed decode steps per point")
    ap.add_argument("--ttft", default="1024,8192")
    ap.add_argument("--ttft-fp8", default="", help="prompt lengths (e.g. 8192) timed with the prefill's projections "
                                                  "in bf16 and in FP8 (--prefill-fp8), alternated; '' for none")
    ap.add_argument("--fp8-rounds", type=int, default=5, help="--ttft-fp8's alternated rounds")
    ap.add_argument("--fp8-prompts", type=int, default=8, help="--ttft-fp8's random prompts for top-1 agreement")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--peer-batches", default="1,16", help="the compiled PyTorch peer's batches ('' for none)")
    ap.add_argument("--grammar-batches", default="", help="batches decoded under a grammar too (e.g. 1,16)")
    ap.add_argument("--mask-threads-ab", default="", help="grammar batches >= 4 also with the masks filled by "
                    "llguidance's pool of each many threads (e.g. 4,8; with --grammar-rounds: copies of one "
                    "grammar, and a grammar compiled per thread; TxL: T threads over L lanes, e.g. 8x16; "
                    "TxLt: the same under the tool-call grammar)")
    ap.add_argument("--grammar-rounds", type=int, default=1,
                    help="> 1: free and grammar decoding alternated this many times a batch, medians reported")
    ap.add_argument("--grammar-ab", action="store_true",
                    help="with --grammar-rounds: also engine_cuda_grammar.grammar_variants() (the masks filled the other way)")
    ap.add_argument("--switch-ab", default="", help="with --grammar-ab: also the fill thread under these GIL "
                    "switch intervals, us (e.g. 50,20; served: GrammarMasker.SWITCH_S)")
    ap.add_argument("--grammar-only", default="", help="with --grammar-rounds: only these variants, beside free "
                    "decoding (';'-separated names as the log writes them inside 'ours (async, ...)', e.g. "
                    "'grammar;grammar, 4 fill processes')")
    ap.add_argument("--grammar-tools", action="store_true",
                    help="with --grammar-rounds: also a tool-call grammar (plain strings) in the same rounds")
    ap.add_argument("--sweep", action="store_true", help="bench/engine_cuda_sweep.py's knobs on the same weights")
    ap.add_argument("--sweep-batches", default="1,2,4,8,16", help="the backends sweep's batches")
    ap.add_argument("--sweep-backends", default="",
                    help="the decode backends the sweep compares (registry names; default: engine_cuda_sweep.BACKENDS)")
    ap.add_argument("--parts-batches", default="1,16", help="the graph-parts sweep's batches")
    ap.add_argument("--sweep-rounds", type=int, default=3, help="the sweep's rounds (each point's median)")
    ap.add_argument("--budget-s", type=float, default=420, help="skip remaining points past this")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="engine_cuda", help="the results' file names: NAME.log, .csv, .md")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(a.budget_s)
    logf = (out / f"{a.name}.log").open("w")

    def log(s: str) -> None:
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    log(f"device {name}, torch {torch.__version__}")
    bw = copy_bandwidth(dev) if dev.type == "cuda" else copy_bandwidth(dev, 256 << 20, 5)
    log(f"copy bandwidth {bw / 1e12:.3f} TB/s")
    if PROMPT + WARM + a.tokens > MIN_LEN_BUCKET:
        # A context past the first span bucket is a new decode graph, captured while the clock runs:
        # on an H200 the first timed point of each batch then read 4-8 ms a step (bench/results/gpu_pdl/).
        log(f"WARNING: {PROMPT} prompt + {WARM} + {a.tokens} tokens cross the {MIN_LEN_BUCKET}-position span "
            f"bucket: each batch's first timed point includes a graph capture (use --tokens "
            f"{MIN_LEN_BUCKET - PROMPT - WARM} or fewer, or read the alternated rounds)")
    rows: list[dict[str, Any]] = []
    shapes = a.shapes.split(",")
    for i, shape in enumerate(shapes):
        if clock.left() < 60:
            log(f"{shape}: skipped (time)")
            continue
        # Each shape gets an even share of what is left, so that the first cannot starve the next.
        share = Clock(clock.left() / (len(shapes) - i))
        try:
            rows += bench_shape(shape, dev, a, share, bw, log)
        except Exception as e:  # one shape failing must not lose the other's figures
            import traceback

            log(f"{shape}: FAILED {type(e).__name__}: {e}\n{traceback.format_exc()}")
        with (out / f"{a.name}.csv").open("w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=["shape", "engine", "metric", "batch", "value", "unit", "note"])
            wr.writeheader()
            wr.writerows(rows)
    table = summary(rows, bw)
    cmd = f"python {sys.argv[0]} " + " ".join(sys.argv[1:])
    (out / f"{a.name}.md").write_text(f"# Engine on {name}\n\n`{cmd}`\n\n{table}\n")
    log(table)


if __name__ == "__main__":
    main()
