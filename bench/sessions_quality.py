"""Agent sessions, routed turn by turn: per-turn outcomes of SmolLM2-135M (our engine) and of the
sessions reference pool (ground truth replayed: an upper bound) on a seeded stratified sample of
BFCL's multi-turn suites, then the counterfactual report (solve rate vs share of turns on large).

    .venv/bin/python bench/sessions_quality.py --per-category 5 --out runs/sessions-quality
    python bench/sessions_quality.py --per-category 0 --device cuda --pools small --max-num-seqs 48 \
        --concurrency 48 --no-report --out $OUT        # every case, the small side, on one GPU

Everything goes through a real gateway (small: the engine, large: `switchyard reference-pool`),
the same commands a user runs with a real small/large pair.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from switchyard.replay.gateway import GatewayProcess, free_port
from switchyard.replay.multiturn.data import CATEGORIES, load_sessions

ROOT = Path(__file__).resolve().parents[1]


def wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 180.0, ok: bool = False) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            r = httpx.get(url, timeout=2, trust_env=False)
            if not ok or r.json().get("status") == "ok":
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not up in {timeout}s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-category", type=int, default=5, help="sessions per suite, sampled; 0: every case")
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--max-steps", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "sessions-quality")
    ap.add_argument("--pools", default="large,small", help="whose per-turn outcomes to collect, in this order")
    ap.add_argument("--device", default="cpu", help="the engine's device (cuda: bf16 weights, graphs)")
    ap.add_argument("--max-num-seqs", type=int, default=2, help="the engine's batch")
    ap.add_argument("--concurrency", type=int, default=2, help="sessions replayed at once")
    ap.add_argument("--engine-args", default="", help="more `engine serve` options, e.g. '--num-kv-blocks 24576'")
    ap.add_argument("--no-report", action="store_true", help="collect only (the report is built elsewhere)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    if args.per_category:
        sources = []
        for cat in CATEGORIES:
            ids = sorted(int(c.id.rsplit("_", 1)[1]) for c in rng.sample(load_sessions(cat), args.per_category))
            sources.append(f"bfcl:{cat}:ids={','.join(map(str, ids))}")
    else:
        sources = ["bfcl:multi_turn"]
    args.out.mkdir(parents=True, exist_ok=True)
    outcomes = args.out / "turn_outcomes.jsonl"
    outcomes.unlink(missing_ok=True)
    ref_port, eng_port = free_port(), free_port()
    from switchyard.engine.serving import registry

    pools = args.pools.split(",")
    ref_log, eng_log = (args.out / "reference.log").open("wb"), (args.out / "engine.log").open("wb")
    procs = [subprocess.Popen([sys.executable, "-m", "switchyard.cli", "reference-pool", *sources, "--port",
                               str(ref_port)], cwd=ROOT, stdout=ref_log, stderr=subprocess.STDOUT)]
    if "small" in pools:
        procs.append(subprocess.Popen([sys.executable, "-m", "switchyard.cli", "engine", "serve", "--model",
                                       str(registry.resolve("smollm2-135m")), "--port", str(eng_port),
                                       "--served-model-name", "smollm2-135m", "--max-num-seqs",
                                       str(args.max_num_seqs), "--device", args.device,
                                       *shlex.split(args.engine_args)],
                                      cwd=ROOT, stdout=eng_log, stderr=subprocess.STDOUT))
    timings = {}
    try:
        wait(f"http://127.0.0.1:{ref_port}/health", procs[0])
        if len(procs) > 1:
            wait(f"http://127.0.0.1:{eng_port}/health", procs[1], ok=True)
        pol = args.out / "policy.yaml"
        pol.write_text(f"""version: 1
pools:
  small: {{model: smollm2-135m, retries: 0, replicas: [{{url: "http://127.0.0.1:{eng_port}/v1"}}]}}
  large: {{model: large, retries: 0, replicas: [{{url: "http://127.0.0.1:{ref_port}/v1"}}]}}
routes:
  - {{name: default, pool: small}}
""", encoding="utf-8")
        cli = [sys.executable, "-m", "switchyard.cli", "replay", *sources]
        with GatewayProcess(pol) as gw:
            for pool in pools:
                t0 = time.perf_counter()
                subprocess.run([*cli, "--gateway", gw.url, "-p", str(pol), "--pool", pool, "--outcomes", str(outcomes),
                                "--max-steps", str(args.max_steps), "--max-tokens", str(args.max_tokens),
                                "--concurrency", str(args.concurrency), "--timeout", "600"], cwd=ROOT, check=True)
                timings[pool] = round(time.perf_counter() - t0, 1)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=20)
    if args.no_report:
        (args.out / "timings.json").write_text(json.dumps({"sources": sources, "wall_s": timings}, indent=2))
        print(json.dumps(timings))
        return
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "switchyard.cli", "replay", "--from-outcomes", str(outcomes),
                    "-p", str(ROOT / "policies" / "default.yaml"), "--out", str(args.out)], cwd=ROOT, check=True)
    timings["report"] = round(time.perf_counter() - t0, 1)
    (args.out / "timings.json").write_text(json.dumps({"sources": sources, "wall_s": timings,
                                                        "max_steps": args.max_steps, "max_tokens": args.max_tokens},
                                                       indent=2), encoding="utf-8")
    print(json.dumps(timings))


if __name__ == "__main__":
    main()
