"""Engine on one GPU: decode tokens/s (batch 1..256), TTFT (1k, 8k prompts), ours vs
transformers `generate` (static cache) on the same random bf16 weights, and the fraction of
the memory-bandwidth limit reached at batch 1.

  python bench/engine_cuda.py --out bench/results            # both shapes, CUDA
  python bench/engine_cuda.py --shapes smollm2-135m --batches 1,4 --tokens 8 --device cpu  # smoke

Weights are random, made on the device, with the real models' shapes (SmolLM2-135M and an
8B Llama); speed depends on the shapes only. Our engine is timed through Decoder.forward,
the runner's per-step call, with the host loop the scheduler runs: build the step's input
tensors on the host, run the step (one CUDA graph replay), greedy argmax on the GPU, read the
tokens back (one host sync per step). HTTP and detokenisation are not included.

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
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from switchyard.engine.model.config import ModelConfig  # noqa: E402
from switchyard.engine.model.decoder import Decoder, weight_bytes_per_token  # noqa: E402
from switchyard.engine.model.random_weights import SHAPES  # noqa: E402
from switchyard.engine.model.step import Step
from switchyard.engine.model.weights import Shard  # noqa: E402
from switchyard.engine.runner.comm import SingleRank  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_compiled import peer_decode_rate  # noqa: E402

PROMPT = 128  # decode-sweep prompt length


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


def decode_rate(m: Decoder, batch: int, tokens: int, vocab: int) -> dict[str, float]:
    """Prefill `batch` prompts into slots 0..batch-1, then time `tokens` greedy decode steps."""
    dev = m.device
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
        nxt = logits.argmax(-1).tolist()  # the one host sync per step, as in the scheduler
        ctx += 1

    t = time.perf_counter()
    step()  # first step of this bucket: captures its graph
    first = time.perf_counter() - t
    for _ in range(2):
        step()
    sync(dev)
    t = time.perf_counter()
    for _ in range(tokens):
        step()
    sync(dev)
    dt = time.perf_counter() - t
    return {"tok_s": batch * tokens / dt, "step_ms": dt / tokens * 1000, "first_step_ms": first * 1000}


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


def bench_shape(name: str, dev: torch.device, batches: list[int], tokens: int, hf: bool, hf_batches: list[int],
                ttft_lens: list[int], clock: Clock, bw: float, log: Any,
                peer_batches: list[int] | None = None) -> list[dict[str, Any]]:
    c = SHAPES[name]
    rows: list[dict[str, Any]] = []

    def add(engine: str, metric: str, batch: int, value: float, unit: str, note: str = "") -> None:
        rows.append({"shape": name, "engine": engine, "metric": metric, "batch": batch,
                     "value": round(value, 3), "unit": unit, "note": note})
        log(f"  {name:13} {engine:22} {metric:18} b={batch:<4} {value:10.2f} {unit} {note}")

    t = time.perf_counter()
    model = hf_model(c, dev)
    w = our_weights(model, c)
    m = Decoder(c, Shard(0, 1, c), w, SingleRank(), max_slots=max(batches), max_len=2 * PROMPT,
                device=dev, dtype=torch.bfloat16, cuda_graphs=True, backend="auto" if dev.type == "cuda" else "torch")
    del w
    log(f"{name}: weights made and loaded in {time.perf_counter() - t:.1f}s; "
        f"{weight_bytes_per_token(m) / 1e9:.3f} GB read per batch-1 step")
    t = time.perf_counter()
    decode_rate(m, 1, min(tokens, 8), c.vocab_size)  # compiles the fused ops
    log(f"  warm-up (compile + first graphs) {time.perf_counter() - t:.1f}s; {m.backend_name} backend, "
        f"ops {m.status().get('fused_ops')}")
    for b in batches:
        if clock.left() < 45:
            log(f"  batch {b}: skipped (time)")
            break
        r = decode_rate(m, b, tokens, c.vocab_size)
        add("ours (graphs)", "decode_tok_s", b, r["tok_s"], "tok/s", f"step {r['step_ms']:.2f} ms")
        if b == 1:
            limit = bw / weight_bytes_per_token(m)
            add("ours (graphs)", "bw_limit_fraction", 1, r["tok_s"] / limit, "x",
                f"limit {limit:.0f} tok/s at {bw / 1e12:.2f} TB/s")
    # The same weights, cache and backend, decode steps run eagerly.
    r = decode_rate(m.view(m.backend_name, cuda_graphs=False, max_slots=m.max_slots), 1, tokens, c.vocab_size)
    add("ours (no graphs)", "decode_tok_s", 1, r["tok_s"], "tok/s", f"step {r['step_ms']:.2f} ms")
    if ttft_lens:
        m.allocate_cache(1, max(ttft_lens) + 16)
        ttft(m, min(ttft_lens), c.vocab_size, reps=1)  # warm-up
        for n in ttft_lens:
            add("ours", "ttft_ms", 1, ttft(m, n, c.vocab_size), "ms", f"prompt {n}")
    del m
    gc.collect()
    # The compiled PyTorch peer (bench/peer_compiled.py) on its own weights of the same shape,
    # right after ours: the same device, clocks and run.
    for b in peer_batches or []:
        if clock.left() < 45:
            log(f"  peer batch {b}: skipped (time)")
            break
        r = peer_decode_rate(c, dev, b, tokens)
        add("compiled peer", "decode_tok_s", b, r["tok_s"], "tok/s",
            f"step {r['step_ms']:.2f} ms, set-up {r['setup_s']:.0f} s")
    if hf and clock.left() > 40:
        hf_generate(model, 1, 16, 2, c.vocab_size)  # warm-up
        hf_generate(model, 1, min(ttft_lens or [PROMPT]), 1, c.vocab_size)
        for b in hf_batches:
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


def summary(rows: list[dict[str, Any]], bw: float) -> str:
    def val(shape: str, engine: str, metric: str, batch: int) -> float | None:
        for r in rows:
            if (r["shape"], r["engine"], r["metric"], r["batch"]) == (shape, engine, metric, batch):
                return float(r["value"])
        return None

    lines = [f"Copy bandwidth (read + write): {bw / 1e12:.2f} TB/s", "",
             "| shape | batch | ours tok/s | compiled peer tok/s | ours / peer | transformers tok/s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for b in sorted({r["batch"] for r in rows if r["shape"] == shape and r["metric"] == "decode_tok_s"}):
            o, h = val(shape, "ours (graphs)", "decode_tok_s", b), val(shape, "transformers static", "decode_tok_s", b)
            p = val(shape, "compiled peer", "decode_tok_s", b)
            if o is None:
                continue
            lines.append(f"| {shape} | {b} | {o:,.0f} | {'' if p is None else f'{p:,.0f}'} | "
                         f"{'' if p is None else f'{o / p:.2f}x'} | {'' if h is None else f'{h:,.0f}'} |")
    lines += ["", "| shape | ours b1 no graphs tok/s | b1 fraction of bandwidth limit | b64 / b1 | "
              "TTFT ours (ms) | TTFT transformers (ms) |", "| --- | --- | --- | --- | --- | --- |"]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        ng = val(shape, "ours (no graphs)", "decode_tok_s", 1)
        fr = val(shape, "ours (graphs)", "bw_limit_fraction", 1)
        b1, b64 = val(shape, "ours (graphs)", "decode_tok_s", 1), val(shape, "ours (graphs)", "decode_tok_s", 64)
        tt = ", ".join(f"{r['note'].split()[-1]}: {r['value']:.0f}" for r in rows
                       if r["shape"] == shape and r["engine"] == "ours" and r["metric"] == "ttft_ms")
        th = ", ".join(f"{r['note'].split()[-1]}: {r['value']:.0f}" for r in rows
                       if r["shape"] == shape and r["engine"] == "transformers static" and r["metric"] == "ttft_ms")
        lines.append(f"| {shape} | {'' if ng is None else f'{ng:,.0f}'} | {'' if fr is None else f'{fr:.0%}'} | "
                     f"{'' if b1 is None or b64 is None else f'{b64 / b1:.1f}x'} | {tt} | {th} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Engine on one GPU (also: bench/engine.py --device cuda ...)")
    ap.add_argument("--shapes", default="smollm2-135m,llama-8b")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--hf-batches", default="1,64")
    ap.add_argument("--tokens", type=int, default=32, help="timed decode steps per point")
    ap.add_argument("--ttft", default="1024,8192")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--peer-batches", default="1,16", help="the compiled PyTorch peer's batches ('' for none)")
    ap.add_argument("--budget-s", type=float, default=420, help="skip remaining points past this")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(a.budget_s)
    logf = (out / "engine_cuda.log").open("w")

    def log(s: str) -> None:
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    log(f"device {name}, torch {torch.__version__}")
    bw = copy_bandwidth(dev) if dev.type == "cuda" else copy_bandwidth(dev, 256 << 20, 5)
    log(f"copy bandwidth {bw / 1e12:.3f} TB/s")
    batches = [int(x) for x in a.batches.split(",")]
    rows: list[dict[str, Any]] = []
    for shape in a.shapes.split(","):
        if clock.left() < 60:
            log(f"{shape}: skipped (time)")
            continue
        try:
            rows += bench_shape(shape, dev, batches, a.tokens, not a.skip_transformers,
                                [int(x) for x in a.hf_batches.split(",") if x], [int(x) for x in a.ttft.split(",") if x],
                                clock, bw, log, [int(x) for x in a.peer_batches.split(",") if x])
        except Exception as e:  # one shape failing must not lose the other's figures
            import traceback

            log(f"{shape}: FAILED {type(e).__name__}: {e}\n{traceback.format_exc()}")
        with (out / "engine_cuda.csv").open("w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=["shape", "engine", "metric", "batch", "value", "unit", "note"])
            wr.writeheader()
            wr.writerows(rows)
    table = summary(rows, bw)
    cmd = "python bench/engine_cuda.py " + " ".join(sys.argv[1:] if argv is None else argv)
    (out / "engine_cuda.md").write_text(f"# Engine on {name}\n\n`{cmd}`\n\n{table}\n")
    log(table)


if __name__ == "__main__":
    main()
