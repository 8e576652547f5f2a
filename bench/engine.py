"""Engine decode benchmark on this machine, ours vs a peer on the same GGUF: transformers
`generate`, or llama.cpp (`--peer llama.cpp`, built by `make llama-cpp`).

  python bench/engine.py [--tokens 64] [--batch 16] [--dtype float32] [--threads 0]
  python bench/engine.py --peer llama.cpp [--threads 2]   # + prefill of a 512-token prompt vs pp512
  python bench/engine.py --long-prompt     # chunked prefill: a running stream vs a long prompt
  python bench/engine.py --device cuda [bench/engine_cuda.py options]   # one GPU, see that file

Prints decode tokens/s at batch 1 and the aggregate at batch N for our engine (the real
scheduler and runner, in-process, no HTTP) and for transformers (in a process of its own), the
ratios, and time to first token. Greedy, EOS ignored so every run generates exactly --tokens
tokens. All measurements alternate, --repeats rounds; each ratio is the median of the
rounds' ratios, with their range. With --peer llama.cpp: llama-bench (pp512, tg) and
llama-batched-bench (1 and N sequences, prompts of our prompts' length) with the same thread
count, and our prefill of a 512-token prompt (512 / its time to first token) against pp512.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

from switchyard.engine.backends.cpu.native import keep_workers_spinning

keep_workers_spinning()  # as `engine serve` does, before torch loads libgomp

import torch  # noqa: E402


def _prompt_ids(tok, i: int = 0) -> list[int]:  # type: ignore[no-untyped-def]
    topics = ["a robot", "the sea", "a city at night", "a lost key", "winter", "a library", "a dragon",
              "the moon", "a train", "a garden", "a clock", "a storm", "a violin", "a desert", "a bridge",
              "a cat"]
    return tok.encode(tok.render([{"role": "user", "content": f"Write a long story about {topics[i % 16]}."}]))


def _start_engine(path: Path, dtype: str, threads: int, max_num_seqs: int, max_model_len: int,
                  **sched_kw: int):  # type: ignore[no-untyped-def]
    """The real runner and scheduler, in-process, no HTTP; returns (scheduler, its thread)."""
    from switchyard.engine.core.scheduler import Scheduler
    from switchyard.engine.runner.model_runner import Runner
    from switchyard.engine.runner.options import EngineOptions
    from switchyard.engine.serving.rank0 import _tokenizer

    runner = Runner(EngineOptions(model_path=path, tp=1, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                  dtype=dtype, threads=threads), 0, 1)
    made: dict[str, Scheduler] = {}
    ready = threading.Event()

    def engine() -> None:
        # Load and step on one thread, as `engine serve` does: a second thread driving
        # OpenMP while the first one's worker team lingers costs ~25% per step.
        runner.setup()
        made["sched"] = Scheduler(runner, _tokenizer(runner), max_num_seqs, max_model_len, **sched_kw)
        ready.set()
        made["sched"].loop()

    loop = threading.Thread(target=engine, daemon=True)
    loop.start()
    ready.wait()
    return made["sched"], loop


def ours(path: Path, dtype: str, threads: int, tokens: int, batch: int):  # type: ignore[no-untyped-def]
    """Our engine, loaded and warm: (run, stop), run(n) -> (decode tok/s, TTFTs in s)."""
    from switchyard.engine.core.sampling import SamplingParams
    from switchyard.engine.core.sequence import Sequence

    sched, loop = _start_engine(path, dtype, threads, max(batch, 1), 1024)
    tok = sched.tok

    def run(n: int) -> tuple[float, list[float]]:
        done = threading.Semaphore(0)
        firsts: dict[int, float] = {}

        def sink_for(k: int):  # type: ignore[no-untyped-def]
            def sink(ev: dict) -> None:
                if ev["type"] == "delta" and k not in firsts:
                    firsts[k] = time.perf_counter()
                if ev["type"] in ("finish", "error"):
                    done.release()
            return sink

        start = time.perf_counter()
        for k in range(n):
            sched.submit(Sequence(prompt=_prompt_ids(tok, k), sink=sink_for(k),
                                  params=SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)))
        for _ in range(n):
            done.acquire()
        total = time.perf_counter() - start
        first = [firsts[k] - start for k in range(n)]
        # Decode rate excludes the prefill (up to the last first token).
        return n * (tokens - 1) / (total - max(first)), first

    def stop() -> None:
        sched.stop()
        loop.join(5)

    run(1)  # warm-up
    return run, stop, sched


def prefill_rate(sched, n: int, salt: int) -> float:  # type: ignore[no-untyped-def]
    """Prefill tok/s of one n-token prompt: n / its time to first token. `salt` makes each
    round's prompt differ from its first token on, so no cached prefix could serve it."""
    from switchyard.engine.core.sampling import SamplingParams
    from switchyard.engine.core.sequence import Sequence

    tok = sched.tok
    words = " ".join(f"{w}{salt}" for w in ("ship", "river", "stone", "lamp", "field", "glass") * 200)
    ids = tok.encode(f"{salt} {words}")[:n]
    first: list[float] = []
    done = threading.Event()

    def sink(ev: dict) -> None:
        if ev["type"] == "delta" and not first:
            first.append(time.perf_counter())
        if ev["type"] in ("finish", "error"):
            done.set()

    start = time.perf_counter()
    sched.submit(Sequence(prompt=ids, sink=sink, params=SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)))
    done.wait()
    return n / (first[0] - start)


def long_prompt(path: Path, dtype: str, threads: int, budget: int) -> dict[str, float]:
    """A stream decodes; a ~1,800-token prompt arrives. The stream's longest gap between tokens
    and the long prompt's TTFT, with `budget` prompt tokens prefilled a step."""
    from switchyard.engine.core.sampling import SamplingParams
    from switchyard.engine.core.sequence import Sequence

    sched, loop = _start_engine(path, dtype, threads, 4, 2048, max_num_batched_tokens=budget)
    tok = sched.tok
    arrivals: list[float] = []
    first: list[float] = []
    done = threading.Semaphore(0)

    def stream_sink(ev: dict) -> None:
        if ev["type"] == "delta":
            arrivals.append(time.perf_counter())
        if ev["type"] in ("finish", "error"):
            done.release()

    def long_sink(ev: dict) -> None:
        if ev["type"] == "delta" and not first:
            first.append(time.perf_counter())
        if ev["type"] in ("finish", "error"):
            done.release()

    sched.submit(Sequence(prompt=tok.encode(tok.render([{"role": "user", "content": "Count to a thousand."}])),
                          sink=stream_sink, params=SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)))
    time.sleep(1.0)
    text = "Summarize: " + " ".join(f"item {i} is a red box." for i in range(190))
    prompt = tok.encode(tok.render([{"role": "user", "content": text}]))
    sent = time.perf_counter()
    sched.submit(Sequence(prompt=prompt, sink=long_sink, params=SamplingParams(max_tokens=8, temperature=0)))
    done.acquire()
    done.acquire()
    sched.stop()
    loop.join(5)
    gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
    return {"prompt_tokens": len(prompt), "ttft_ms": (first[0] - sent) * 1000, "max_gap_ms": gaps[-1] * 1000,
            "median_gap_ms": gaps[len(gaps) // 2] * 1000}


def transformers_ref(path: Path, threads: int, tokens: int, batch: int):  # type: ignore[no-untyped-def]
    """transformers `generate` on the same GGUF: run(n) -> (decode tok/s, [TTFT in s]), each batch
    size on its best thread count (1 or all cores)."""
    from transformers import AutoConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from switchyard.engine.chat.tokenizer import from_gguf
    from switchyard.engine.model.weights import GGUFSource

    cfg = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)
    model.to(torch.float32)
    tok = from_gguf(GGUFSource(path).reader)

    def gen(n: int) -> tuple[float, float]:
        prompts = [_prompt_ids(tok, k) for k in range(n)]
        L = max(map(len, prompts))
        ids = torch.tensor([[2] * (L - len(p)) + p for p in prompts])  # left-pad, as generate expects
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            t = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False, pad_token_id=2)
            ttft = time.perf_counter() - t
            t = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                           do_sample=False, pad_token_id=2)
            total = time.perf_counter() - t
        return total, ttft

    def timed(n: int, th: int) -> tuple[float, list[float]]:
        torch.set_num_threads(th)
        total, ttft = gen(n)
        return n * (tokens - 1) / (total - ttft), [ttft]

    choices = [threads] if threads else sorted({1, torch.get_num_threads()})
    for th in choices:
        timed(1, th)  # warm-up
    best = {b: max(choices, key=lambda th, b=b: timed(b, th)[0]) for b in (1, batch)}
    return lambda n: timed(n, best[n])


def _transformers_worker(conn, path: Path, threads: int, tokens: int, batch: int) -> None:  # type: ignore[no-untyped-def]
    keep_workers_spinning()
    run = transformers_ref(path, threads, tokens, batch)
    conn.send("ready")
    while (n := conn.recv()) is not None:
        conn.send(run(n))


def transformers_process(path: Path, threads: int, tokens: int, batch: int):  # type: ignore[no-untyped-def]
    """transformers in its own process: in ours, its OpenMP team would double the threads
    libgomp manages, and libgomp then stops every idle worker from spinning (ours ran 20-30%
    slower at batch 1 with transformers loaded beside it). Returns (run, stop)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_transformers_worker, args=(there, path, threads, tokens, batch), daemon=True)
    proc.start()
    assert here.recv() == "ready"

    def run(n: int) -> tuple[float, list[float]]:
        here.send(n)
        return here.recv()

    def stop() -> None:
        here.send(None)
        proc.join(30)

    return run, stop


def main() -> None:
    argv = sys.argv[1:]
    if "--device" in argv and argv[argv.index("--device") + 1:][:1] == ["cuda"]:
        # The GPU benchmark (random bf16 weights of SmolLM2's and an 8B shape) has its own options.
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from engine_cuda import main as cuda_main

        cuda_main(argv)
        return
    ap = argparse.ArgumentParser(description="CPU engine benchmark; --device cuda runs bench/engine_cuda.py")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5,
                    help="rounds, each measuring every figure once, back to back; medians are reported")
    ap.add_argument("--peer", default="transformers", choices=["transformers", "llama.cpp", "none"])
    ap.add_argument("--skip-transformers", action="store_true", help="same as --peer none")
    ap.add_argument("--long-prompt", action="store_true",
                    help="only: a stream's longest token gap while a ~1,800-token prompt is prefilled, "
                         "chunked (--max-num-batched-tokens 512) vs in one step")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    from switchyard.engine.serving import registry

    path = registry.pull("smollm2-135m")
    if a.long_prompt:
        for budget in (512, 4096):
            r = long_prompt(path, a.dtype, a.threads, budget)
            print(f"prefill {budget} tokens a step: {r['prompt_tokens']}-token prompt TTFT {r['ttft_ms']:.0f} ms; "
                  f"running stream: longest gap {r['max_gap_ms']:.0f} ms, median {r['median_gap_ms']:.0f} ms")
        return
    peer = "none" if a.skip_transformers else a.peer
    if peer == "llama.cpp":
        _vs_llama_cpp(path, a)
        return
    theirs, stop_theirs = (None, None) if peer == "none" else transformers_process(path, a.threads, a.tokens, a.batch)
    run, stop, sched = ours(path, a.dtype, a.threads, a.tokens, a.batch)
    prefill_rate(sched, 512, -1)  # warm-up at this length
    # Every measurement alternates with the others, `repeats` rounds, each figure a median. The
    # shared 2-core VM has slow and fast spells of tens of seconds (the same step 1.5x slower):
    # a ratio is taken within a round, where both sides saw the same spell.
    rounds: list[dict[str, tuple[float, list[float]]]] = []
    # Between the two engines, a pause: each one's idle OpenMP workers spin on the cores for up
    # to ~0.6 s (GOMP_SPINCOUNT, as `engine serve` sets it) and would slow the other.
    for i in range(a.repeats):
        r = {"o1": run(1), "oN": run(a.batch), "op": (prefill_rate(sched, 512, i), [])}
        if theirs is not None:
            time.sleep(1.5)
            r["t1"], r["tN"] = theirs(1), theirs(a.batch)
            time.sleep(1.5)
        rounds.append(r)
    stop()
    if stop_theirs is not None:
        stop_theirs()

    def med(key: str) -> float:
        return statistics.median(r[key][0] for r in rounds)

    def ratio(num: str, den: str) -> str:
        return _ratio([r[num][0] / r[den][0] for r in rounds])

    ttft1 = statistics.median(r["o1"][1][0] for r in rounds) * 1000
    ttftN = statistics.median(statistics.median(r["oN"][1]) for r in rounds) * 1000
    print(f"ours ({a.dtype}):  batch 1 {med('o1'):.1f} tok/s, TTFT {ttft1:.0f} ms | "
          f"batch {a.batch} {med('oN'):.1f} tok/s aggregate decode, median TTFT {ttftN:.0f} ms "
          f"| prefill 512 {med('op'):.0f} tok/s ({a.repeats} rounds, medians; threads {a.threads or 'all'})")
    print(f"ours: batch {a.batch} / batch 1 = {ratio('oN', 'o1')}  (target >= 8x)")
    if theirs is None:
        return
    t_ttft = statistics.median(r["t1"][1][0] for r in rounds) * 1000
    print(f"transformers (float32): batch 1 {med('t1'):.1f} tok/s, TTFT {t_ttft:.0f} ms | "
          f"batch {a.batch} {med('tN'):.1f} tok/s aggregate decode")
    print(f"ours / transformers: batch 1 {ratio('o1', 't1')} (target >= 3x), batch {a.batch} {ratio('oN', 'tN')}, "
          f"TTFT {t_ttft / ttft1:.2f}x")


def _ratio(values: list[float]) -> str:
    v = sorted(values)
    return f"{statistics.median(v):.2f}x (rounds {v[0]:.2f}-{v[-1]:.2f}x)"


def _vs_llama_cpp(path: Path, a: argparse.Namespace) -> None:
    """Ours against llama.cpp's llama-bench and llama-batched-bench, round by round."""
    import os

    from peer_llamacpp import peer_round

    from switchyard.llamacpp import LlamaCppMissing, locate

    try:
        bins = locate()
    except LlamaCppMissing as e:
        raise SystemExit(f"--peer llama.cpp: {e}") from None
    threads = a.threads or torch.get_num_threads() or os.cpu_count() or 1
    run, stop, sched = ours(path, a.dtype, threads, a.tokens, a.batch)
    prompt_len = round(statistics.mean(len(_prompt_ids(sched.tok, k)) for k in range(a.batch)))
    prefill_rate(sched, 512, -1)  # warm-up at this length
    rows: list[dict[str, float]] = []
    for i in range(a.repeats):
        r = {"o1": run(1)[0], "oN": run(a.batch)[0], "op": prefill_rate(sched, 512, i)}
        time.sleep(1.5)  # our idle OpenMP workers spin for up to ~0.6 s
        p = peer_round(bins, path, threads, a.tokens, prompt_len, a.batch)
        r.update(l1=p.decode[1], lN=p.decode[a.batch], lp=p.pp512, ltg=p.tg)
        rows.append(r)
        print(f"round {i + 1}: ours b1 {r['o1']:.1f} bN {r['oN']:.1f} prefill {r['op']:.0f} | llama.cpp b1 "
              f"{r['l1']:.1f} (tg{a.tokens} {r['ltg']:.1f}) bN {r['lN']:.1f} pp512 {r['lp']:.0f} tok/s", flush=True)
    stop()

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    def ratio(num: str, den: str) -> str:
        return _ratio([r[num] / r[den] for r in rows])

    from switchyard.engine.backends.cpu import native

    print(f"threads {threads}, {a.tokens} new tokens, prompts of ~{prompt_len} tokens, {a.repeats} rounds (medians); "
          f"CPU: {native.cpu_model()}; our native build: {native.load()[1] or 'none (torch ops)'}; llama.cpp in {bins.root}")
    print(f"ours ({a.dtype}): batch 1 {med('o1'):.1f} tok/s | batch {a.batch} {med('oN'):.1f} tok/s aggregate | "
          f"prefill 512 {med('op'):.0f} tok/s")
    print(f"llama.cpp {bins.version}: batch 1 {med('l1'):.1f} tok/s (llama-batched-bench; llama-bench "
          f"tg{a.tokens} {med('ltg'):.1f}) | batch {a.batch} {med('lN'):.1f} tok/s aggregate | pp512 {med('lp'):.0f} tok/s")
    print(f"ours / llama.cpp: batch 1 {ratio('o1', 'l1')} (target >= 1.2x; vs tg{a.tokens} {ratio('o1', 'ltg')}), "
          f"batch {a.batch} {ratio('oN', 'lN')} (target >= 2x), prefill 512 {ratio('op', 'lp')} (target >= 1x)")


if __name__ == "__main__":
    main()
