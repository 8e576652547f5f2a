"""Prefix caching on a multi-turn agent trace: one engine with and without it.

  PYTHONPATH=. python bench/prefix_cache.py [--rounds 2] [--shared-system]
                                            [--out bench/results/prefix_cache.json]

Replays bench/agent_trace.py's trace (8 sessions x 6 turns, a ~1.5k-token system prompt with
tool docs, each turn adding a tool call, its result and a user message) against two fresh
`switchyard engine serve` processes, one with prefix caching and one with
--no-prefix-caching. Every request goes to both, back to back, in alternating order, and only
one engine works at a time: on a shared machine whose speed swings by several times within
minutes, only measurements taken side by side compare. Reports per turn the median time to
first token of both and the median (and range) of the pairs' ratios, and the share of prompt
tokens served from the cache (from each response's usage.prompt_tokens_details.cached_tokens,
and the engine's own counters in /health). Sessions run one after another, so a turn's TTFT
is its own prefill, not a queue behind other sessions' (bench/agent_trace.py --replay runs
them concurrently). Each round starts fresh engines, so every round begins with an empty cache.
"""

from __future__ import annotations

import argparse
import json
import os
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
from agent_trace import Result, Turn, hit_rate, make_trace, per_turn, send  # noqa: E402

from switchyard.engine.backends.cpu.native import cpu_model  # noqa: E402

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


def run_round(engine_args: list[str], trace: list[list[Turn]], log_dir: Path, r: int
              ) -> tuple[dict[str, list[Result]], dict[str, dict[str, Any]]]:
    """Both engines up, every turn to both (order alternating), both stopped."""
    engines = {"cached": Engine(engine_args, log_dir / f"prefix_cache_cached_{r}.log"),
               "uncached": Engine([*engine_args, "--no-prefix-caching"], log_dir / f"prefix_cache_uncached_{r}.log")}
    try:
        # One short request each first: the first step of a fresh process pays one-off costs.
        warm = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        for eng in engines.values():
            urllib.request.urlopen(urllib.request.Request(eng.url + "/v1/chat/completions",
                                                          json.dumps(warm).encode(),
                                                          {"Content-Type": "application/json"}), timeout=300).read()
        results: dict[str, list[Result]] = {"cached": [], "uncached": []}
        k = r
        for session in trace:
            for turn in session:
                k += 1
                for mode in (("cached", "uncached") if k % 2 else ("uncached", "cached")):
                    res = send(engines[mode].url + "/v1", turn)
                    if res.error:
                        raise SystemExit(f"{mode} engine, {turn.session} turn {turn.turn}: {res.error}")
                    results[mode].append(res)
                    time.sleep(0.05)  # the other engine's OpenMP workers stop spinning
        return results, {m: e.health() for m, e in engines.items()}
    finally:
        for eng in engines.values():
            eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1, help="fresh engines, the whole trace")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--shared-system", action="store_true", help="one system prompt for all sessions")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--engine-args", default="--max-model-len 4096 --max-num-seqs 8",
                    help="more `engine serve` options (both engines)")
    ap.add_argument("--out", type=Path, help="write every result and the summary as JSON")
    a = ap.parse_args()
    trace = make_trace(a.sessions, a.turns, a.system_tokens, shared_system=a.shared_system, max_tokens=a.max_tokens)
    engine_args = ["--model", a.model, *a.engine_args.split()]
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    runs: dict[str, list[Result]] = {"cached": [], "uncached": []}
    health: dict[str, dict[str, Any]] = {}
    for r in range(a.rounds):
        t0 = time.perf_counter()
        results, health = run_round(engine_args, trace, logs, r)
        for m in runs:
            runs[m].extend(results[m])
        print(f"round {r + 1}: {time.perf_counter() - t0:.0f} s, hit rate {hit_rate(results['cached']):.3f}",
              file=sys.stderr)

    dev = health["cached"].get("device", {})
    print(f"\nCPU: {cpu_model()}, {os.cpu_count()} cores; native build: {dev.get('int4_kernel', '-')}, "
          f"KV cache {dev.get('kv_cache_dtype', '-')}; {a.sessions} sessions x {a.turns} turns, "
          f"{'one shared' if a.shared_system else 'a per-session'} ~{a.system_tokens}-token system prompt, "
          f"{a.rounds} round(s)\n")
    print("| turn | prompt tokens | cached tokens | TTFT without caching | TTFT with caching | ratio (pairs' median, range) |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = []
    # Results of both engines come in the same order: request i of one is request i of the other.
    pairs = list(zip(runs["uncached"], runs["cached"], strict=True))
    for t, rs in per_turn(runs["cached"]):
        mine = [(u, c) for u, c in pairs if c.turn == t]
        ratios = [u.ttft_s / c.ttft_s for u, c in mine]
        off, on = statistics.median(u.ttft_s for u, _ in mine), statistics.median(c.ttft_s for _, c in mine)
        row = {"turn": t, "prompt_tokens": statistics.median(x.prompt_tokens for x in rs),
               "cached_tokens": statistics.median(x.cached_tokens for x in rs), "ttft_uncached_s": off,
               "ttft_cached_s": on, "ratio": statistics.median(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios)}
        rows.append(row)
        print(f"| {t} | {row['prompt_tokens']:.0f} | {row['cached_tokens']:.0f} | {off * 1000:.0f} ms | "
              f"{on * 1000:.0f} ms | {row['ratio']:.1f}x ({min(ratios):.1f}-{max(ratios):.1f}x) |")
    later = [r["ratio"] for r in rows if r["turn"] >= 2]
    kv = health["cached"].get("kv_cache", {})
    summary = {"hit_rate": hit_rate(runs["cached"]), "hit_rate_turn2_on": hit_rate(runs["cached"], 2),
               "engine_hit_rate": kv.get("prefix_cache_hit_rate"), "min_ratio_turn2_on": min(later) if later else None,
               "uncached_hit_rate": hit_rate(runs["uncached"])}
    print(f"\nprefix-cache hit rate: {summary['hit_rate']:.3f} of all prompt tokens, "
          f"{summary['hit_rate_turn2_on']:.3f} from turn 2 on (the engine's counter, last round: "
          f"{kv.get('prefix_cache_hit_rate')}); without caching: {summary['uncached_hit_rate']:.3f}")
    if later:
        print(f"TTFT from turn 2 on: {min(later):.1f}x-{max(later):.1f}x lower with caching (per-turn medians)")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"args": vars(a) | {"out": str(a.out)}, "cpu": cpu_model(), "device": dev,
                                     "turns": rows, "summary": summary, "health": health,
                                     "results": {m: [x.__dict__ for x in v] for m, v in runs.items()}},
                                    indent=1, default=str))


if __name__ == "__main__":
    main()
