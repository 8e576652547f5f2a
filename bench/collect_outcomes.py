"""The small model's real outcomes, and the reference pool's, on tooluse-92 and bfcl-sample: the
data the outcome router is trained and judged on (data/outcomes/smollm2-135m.jsonl.gz).

    python bench/collect_outcomes.py                   # starts both upstreams, writes the shipped file
    python bench/collect_outcomes.py --small URL       # an engine (or a gateway's small pool) already up

It is these commands, with progress, resumption and a gzip at the end:

    switchyard engine serve --model smollm2-135m --port 8101 --max-num-seqs 16 --max-model-len 2048 &
    switchyard reference-pool tooluse-92 bfcl-sample --port 8301 &
    switchyard replay tooluse-92 bfcl-sample --gateway http://127.0.0.1:8101 --model smollm2-135m \\
        --pool small --max-tokens 256 --outcomes OUT.jsonl
    switchyard replay tooluse-92 bfcl-sample --gateway http://127.0.0.1:8301 --pool large --outcomes OUT.jsonl

The small side is the embedded default's small pool as `switchyard up` starts it (one engine
replica, TP=1, the policy's engine arguments); requests go as the traces give them (no
tool_choice: the model may answer in text or call a tool, and the engine's constrained decoding
keeps a call it starts well-formed), at temperature 0 and max_tokens 256. The cap only bounds
the time: SmolLM2 answers in prose when it does not call (mean 706 tokens, up to ~1,750, over the
first 177 cases of an uncapped run), and a reply that has not opened a call in 256 tokens does
not open one; in that uncapped run every right answer but the irrelevance cases' (right when they
call nothing) took at most 66 tokens. Each outcome is
appended (under ~/.cache/switchyard/outcomes/) as soon as it is scored, so an interrupted run resumes where it stopped (the finished
(case, pool) pairs are skipped). Greedy decoding on the engine's batch-invariant kernels makes
`correct` reproducible; latencies are this machine's, under whatever else it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from switchyard.datasets import cache_dir  # noqa: E402
from switchyard.replay.cases import Case  # noqa: E402
from switchyard.replay.gateway import free_port  # noqa: E402
from switchyard.replay.live import LiveClient  # noqa: E402
from switchyard.replay.outcomes import outcome_line, refused  # noqa: E402
from switchyard.replay.results import CaseResult  # noqa: E402
from switchyard.replay.sources import load_sources  # noqa: E402

SOURCES = ["tooluse-92", "bfcl-sample"]
OUT = ROOT / "data" / "outcomes" / "smollm2-135m.jsonl.gz"
# The embedded default's small pool (policies/default.yaml).
ENGINE_ARGS = ["--model", "smollm2-135m", "--max-num-seqs", "16", "--max-model-len", "2048"]


def start(cmd: list[str], health: str, log: Path, timeout: float = 600.0) -> subprocess.Popen[bytes]:
    f = log.open("ab")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(health, timeout=2.0, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    proc.terminate()
    raise RuntimeError(f"{' '.join(cmd)} not ready within {timeout:g}s; see {log}")


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def done_pairs(partial: Path) -> set[tuple[str, str]]:
    if not partial.exists():
        return set()
    pairs = set()
    for line in partial.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            pairs.add((d["id"], d["pool"]))
    return pairs


async def collect(cases: list[Case], url: str, pool: str, model: str, partial: Path, concurrency: int,
                  timeout: float, max_tokens: int | None = None) -> None:
    todo = [c for c in cases if (c.id, pool) not in done_pairs(partial)]
    if not todo:
        print(f"{pool}: all {len(cases)} cases done already", flush=True)
        return
    by_id = {c.id: c for c in todo}
    t0 = time.monotonic()
    state = {"n": 0, "right": 0, "dropped": 0}

    def on_done(r: CaseResult) -> None:
        state["n"] += 1
        keep = (r.status == "ok" or refused(r)) and r.correct is not None
        if keep:
            with partial.open("a", encoding="utf-8") as f:
                f.write(json.dumps(outcome_line(by_id[r.id], r, model)) + "\n")
            state["right"] += bool(r.correct)
        else:
            state["dropped"] += 1
        n = state["n"]
        if n % 10 == 0 or n == len(todo):
            rate = n / (time.monotonic() - t0)
            eta = (len(todo) - n) / rate if rate else 0.0
            print(f"{pool}: {n}/{len(todo)} ({state['right']} right, {state['dropped']} unanswered), "
                  f"{rate * 60:.1f} cases/min, about {eta / 60:.0f} min left", flush=True)

    extra: dict[str, object] = {"temperature": 0}
    if max_tokens:
        extra["max_tokens"] = max_tokens
    client = LiveClient(url, concurrency, timeout, retries=2, extra_body=extra)
    await client.run(todo, model, pool, on_done)
    if client.unreachable or client.interrupted:
        raise SystemExit(f"{pool}: stopped ({client.unreachable or client.interrupted}); run again to resume")


def finish(partial: Path, out: Path, order: list[str]) -> None:
    """Latest line per (case, pool), in suite order, small before large; gzip without a timestamp."""
    rows: dict[tuple[str, str], str] = {}
    for line in partial.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            rows[(d["id"], d["pool"])] = line
    rank = {cid: k for k, cid in enumerate(order)}
    keys = sorted(rows, key=lambda k: (rank.get(k[0], len(rank)), k[1] != "small"))
    data = "".join(rows[k] + "\n" for k in keys).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(data)
    print(f"wrote {out} ({len(rows)} outcomes, {out.stat().st_size / 1e6:.2f} MB)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", nargs="+", default=SOURCES)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--small", help="A running engine or OpenAI server for the small side (default: start one)")
    ap.add_argument("--model", default="smollm2-135m", help="`model` sent to the small side")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=900.0, help="Seconds per request")
    ap.add_argument("--max-tokens", type=int, default=256, help="max_tokens sent to the small side (0: none)")
    args = ap.parse_args()

    cases, errors = load_sources(args.sources)
    if errors:
        raise SystemExit("\n".join(map(str, errors)))
    # Work files live in the cache, keyed by the output's name: a rerun resumes, the tree stays clean.
    partial = cache_dir("outcomes") / (args.out.name.removesuffix(".gz") + ".partial")
    log = partial.with_suffix(".log")
    print(f"{len(cases)} cases from {' '.join(args.sources)}; outcomes appended to {partial}; "
          f"server logs in {log}", flush=True)
    py = [sys.executable, "-m", "switchyard.cli"]
    engine = ref = None
    try:
        small = args.small
        if small is None:
            port = free_port()
            engine = start([*py, "engine", "serve", *ENGINE_ARGS, "--port", str(port)],
                           f"http://127.0.0.1:{port}/health", log)
            small = f"http://127.0.0.1:{port}"
        ref_port = free_port()
        ref = start([*py, "reference-pool", *args.sources, "--port", str(ref_port)],
                    f"http://127.0.0.1:{ref_port}/health", log)
        asyncio.run(collect(cases, f"http://127.0.0.1:{ref_port}", "large", "reference", partial,
                            args.concurrency, args.timeout))
        asyncio.run(collect(cases, small, "small", args.model, partial, args.concurrency, args.timeout,
                            args.max_tokens))
    finally:
        stop(engine)
        stop(ref)
    finish(partial, args.out, [c.id for c in cases])


if __name__ == "__main__":
    main()
