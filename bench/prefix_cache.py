"""Prefix caching on a multi-turn agent trace: one engine with and without it.

  PYTHONPATH=. python bench/prefix_cache.py [--rounds 2] [--concurrency 1] [--shared-system]
                                            [--out bench/results/prefix_cache.json]

Replays bench/agent_trace.py's trace (8 sessions x 6 turns, a ~1.5k-token system prompt with
tool docs, each turn adding a tool call, its result and a user message) against a fresh
`switchyard engine serve` with prefix caching and one with --no-prefix-caching, alternating
which goes first each round. Reports the median time to first token per turn for both, their
ratio, and the share of prompt tokens served from the cache (from each response's
usage.prompt_tokens_details.cached_tokens, and the engine's own counters in /health).
Sessions run one after another by default (--concurrency 1), so a turn's TTFT is its own
prefill, not a queue behind other sessions'.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_trace import Result, hit_rate, make_trace, per_turn, replay  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


class Engine:
    """`switchyard engine serve` in a process of its own, ready when /health answers 200."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("w")
        self.p = subprocess.Popen([sys.executable, "-m", "switchyard.cli", "engine", "serve", "--port",
                                   str(self.port), *args], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"engine exited with {self.p.returncode}; see {log}")
            try:
                if _get(self.url + "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"engine not ready after 300 s; see {log}")

    def health(self) -> dict[str, Any]:
        return _get(self.url + "/health")[1]

    def close(self) -> None:
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_mode(caching: bool, engine_args: list[str], trace: list, concurrency: int, log: Path
             ) -> tuple[list[Result], dict[str, Any]]:
    eng = Engine([*engine_args] + ([] if caching else ["--no-prefix-caching"]), log)
    try:
        # One short request first: the first step of a fresh process pays one-off costs.
        warm = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        urllib.request.urlopen(urllib.request.Request(eng.url + "/v1/chat/completions", json.dumps(warm).encode(),
                                                      {"Content-Type": "application/json"}), timeout=120).read()
        results = replay(eng.url + "/v1", trace, concurrency)
        return results, eng.health()
    finally:
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1, help="cached and uncached runs each, alternating")
    ap.add_argument("--concurrency", type=int, default=1, help="sessions in flight at once")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--shared-system", action="store_true", help="one system prompt for all sessions")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--engine-args", default="--max-model-len 4096 --max-num-seqs 8",
                    help="more `engine serve` options (both modes)")
    ap.add_argument("--out", type=Path, help="write every result and the summary as JSON")
    a = ap.parse_args()
    trace = make_trace(a.sessions, a.turns, a.system_tokens, shared_system=a.shared_system, max_tokens=a.max_tokens)
    engine_args = ["--model", a.model, *a.engine_args.split()]
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    runs: dict[str, list[list[Result]]] = {"cached": [], "uncached": []}
    health: dict[str, dict[str, Any]] = {}
    for r in range(a.rounds):
        for mode in (("cached", "uncached") if r % 2 == 0 else ("uncached", "cached")):
            t0 = time.perf_counter()
            results, h = run_mode(mode == "cached", engine_args, trace, a.concurrency,
                                  logs / f"prefix_cache_{mode}_{r}.log")
            errors = [x.error for x in results if x.error]
            if errors:
                raise SystemExit(f"{mode}: {len(errors)} requests failed, e.g. {errors[0]}")
            runs[mode].append(results)
            health[mode] = h
            print(f"round {r + 1} {mode}: {time.perf_counter() - t0:.0f} s, hit rate {hit_rate(results):.3f}",
                  file=sys.stderr)

    def med(mode: str, turn: int) -> float:
        return statistics.median(x.ttft_s for rs in runs[mode] for x in rs if x.turn == turn)

    dev = health["cached"].get("device", {})
    print(f"\nCPU: {_cpu()}, {os.cpu_count()} cores; native build: {dev.get('int4_kernel', '-')}, "
          f"KV cache {dev.get('kv_cache_dtype', '-')}; {a.sessions} sessions x {a.turns} turns, "
          f"{'one shared' if a.shared_system else 'a per-session'} ~{a.system_tokens}-token system prompt, "
          f"concurrency {a.concurrency}, {a.rounds} round(s)\n")
    print("| turn | prompt tokens (median) | cached tokens (median) | TTFT without caching | TTFT with caching | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = []
    cached_all = [x for rs in runs["cached"] for x in rs]
    for t, rs in per_turn(cached_all):
        off, on = med("uncached", t), med("cached", t)
        row = {"turn": t, "prompt_tokens": statistics.median(x.prompt_tokens for x in rs),
               "cached_tokens": statistics.median(x.cached_tokens for x in rs), "ttft_uncached_s": off,
               "ttft_cached_s": on, "ratio": off / on}
        rows.append(row)
        print(f"| {t} | {row['prompt_tokens']:.0f} | {row['cached_tokens']:.0f} | {off * 1000:.0f} ms | "
              f"{on * 1000:.0f} ms | {off / on:.1f}x |")
    later = [r["ratio"] for r in rows if r["turn"] >= 2]
    kv = health["cached"].get("kv_cache", {})
    summary = {"hit_rate": hit_rate(cached_all), "hit_rate_turn2_on": hit_rate(cached_all, 2),
               "engine_hit_rate": kv.get("prefix_cache_hit_rate"), "min_ratio_turn2_on": min(later) if later else None,
               "uncached_hit_rate": hit_rate([x for rs in runs["uncached"] for x in rs])}
    print(f"\nprefix-cache hit rate: {summary['hit_rate']:.3f} of all prompt tokens, "
          f"{summary['hit_rate_turn2_on']:.3f} from turn 2 on (engine's counter: {kv.get('prefix_cache_hit_rate')}); "
          f"without caching: {summary['uncached_hit_rate']:.3f}")
    if later:
        print(f"TTFT from turn 2 on: {min(later):.1f}x-{max(later):.1f}x lower with caching")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"args": vars(a) | {"out": str(a.out)}, "cpu": _cpu(), "device": dev,
                                     "turns": rows, "summary": summary, "health": health,
                                     "results": {m: [[x.__dict__ for x in rs] for rs in v] for m, v in runs.items()}},
                                    indent=1, default=str))


if __name__ == "__main__":
    main()
