"""llama.cpp's own benchmarks on the same GGUF and thread count, for bench/engine.py --peer llama.cpp.

- `llama-bench -p 512 -n 64`: pp512 (prefill of a 512-token prompt, tok/s) and tg64 (decode
  at batch 1 from an empty context, tok/s);
- `llama-batched-bench -npl 1,16`: aggregate decode tok/s of 1 and 16 sequences, each with
  its own prompt of our prompts' length, `tokens` new tokens each (S_TG), as our batch 1 and
  batch N runs do.

Each call is one round (one repetition, after llama-bench's own warm-up run), so the caller
alternates rounds with ours. Binaries from switchyard.llamacpp (`make llama-cpp`).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from switchyard.llamacpp import LlamaCpp


@dataclass(frozen=True)
class PeerRound:
    pp512: float  # prefill tok/s of a 512-token prompt
    tg: float  # llama-bench decode tok/s at batch 1 (empty context)
    decode: dict[int, float]  # llama-batched-bench: sequences -> aggregate decode tok/s


def _run(cmd: list[str], timeout: float) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return proc.stdout


def llama_bench(bins: LlamaCpp, model: Path, threads: int, tokens: int) -> tuple[float, float]:
    """(pp512 tok/s, tg<tokens> tok/s), one repetition each."""
    out = _run([str(bins.bench), "-m", str(model), "-t", str(threads), "-p", "512", "-n", str(tokens),
                "-r", "1", "-o", "json"], timeout=600)
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] == 512 and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_prompt"] == 0 and r["n_gen"] == tokens)
    return float(pp), float(tg)


def batched_bench(bins: LlamaCpp, model: Path, threads: int, tokens: int, prompt_len: int,
                  batches: tuple[int, ...]) -> dict[int, float]:
    """Aggregate decode tok/s (S_TG) for each number of parallel sequences."""
    ctx = max(batches) * (prompt_len + tokens) + 64
    out = _run([str(bins.batched_bench), "-m", str(model), "-t", str(threads), "-c", str(ctx),
                "-b", "2048", "-ub", "512", "-npp", str(prompt_len), "-ntg", str(tokens),
                "-npl", ",".join(map(str, batches)), "--output-format", "jsonl"], timeout=600)
    speeds = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            speeds[int(row["pl"])] = float(row["speed_tg"])
    missing = [b for b in batches if b not in speeds]
    if missing:
        raise RuntimeError(f"llama-batched-bench gave no figure for {missing} sequences: {out[-800:]}")
    return speeds


def peer_round(bins: LlamaCpp, model: Path, threads: int, tokens: int, prompt_len: int, batch: int) -> PeerRound:
    pp, tg = llama_bench(bins, model, threads, tokens)
    return PeerRound(pp, tg, batched_bench(bins, model, threads, tokens, prompt_len, (1, batch)))
