"""Cache-aware routing on a multi-turn agent trace: two engine replicas behind the gateway.

  PYTHONPATH=. python bench/cache_routing.py [--rounds 3] [--sessions 8 --turns 6]
                                             [--out bench/results/cache_routing.json]
  PYTHONPATH=. python bench/cache_routing.py --quick   # a few minutes: proves the script works

Replays bench/agent_trace.py's trace (8 sessions x 6 turns, each session its own ~1.5k-token
system prompt with tool docs, each turn adding a tool call, its result and a user message)
through `switchyard serve` in front of two `switchyard engine serve` replicas, one pool of
both, under three policies:

  cache_aware     strategy: cache_aware (consistent hash of the prefix, bounded loads)
  least_inflight  strategy: least_inflight
  pin_replica     strategy: least_inflight, session.pin: replica (x-session-id)

Sessions run concurrently, each session's turns in order (agent_trace.replay), so a turn's
replica choice happens while the other sessions load the pool. Before each turn the agent
"runs its tool": a think time drawn uniformly from [0, 2 x --think-s] (seeded, the same for
every policy; on turn 1 it staggers the sessions' arrivals). Without it the closed loop flatters
least_inflight: when a session's turn ends, its replica has one request fewer than the other,
so the session's next turn goes back to it, cache and all; with agents that pause between
turns, other sessions' arrivals decide where a turn lands.

Fairness between policies: every policy gets two fresh replicas (restarted, so their caches
are empty) and the same trace; distinct prompts per policy would have kept the engines up but
given each policy different prompt lengths to prefill. Fresh replicas listen on fresh ports,
so cache_aware's ring (a hash of the replica URLs) places the sessions differently in each
round: over rounds, the figures average over placements, not one lucky or unlucky ring. The
order of the policies rotates from round to round, so that none always runs first or last
on a machine whose speed drifts.

Per policy, over all rounds: the prefix-cache hit rate (sum of usage.prompt_tokens_details.
cached_tokens / sum of prompt_tokens, over turns 2+ and over all turns), mean and p99 time to
first token (through the gateway), the share of sessions whose turns all went to one replica,
the share of turns 2+ sent to another replica than their session's previous turn (each one
prefills its history again; cache_aware passes a served prefix's turn on when its replica is
over 1.5x the mean in flight, a new one's over 1.25x), and the load imbalance (max over the two replicas of requests
served / their mean; per round, since two rounds' replicas are different processes), with the
requests per replica. The pool has no retries and no active health checks: a check timing out
behind a long prefill would take a replica out, and this compares strategies, not health.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_trace import Result, Turn, hit_rate, make_trace, replay  # noqa: E402
from prefix_cache import ROOT, Engine, _cpu, _get, _port  # noqa: E402

POLICY_NAME = "agents"  # the virtual model the trace asks for
POLICIES: dict[str, tuple[str, str]] = {  # name: (strategy, session.pin)
    "cache_aware": ("cache_aware", "none"),
    "least_inflight": ("least_inflight", "none"),
    "pin_replica": ("least_inflight", "replica"),
}
REPLICAS = ("r0", "r1")


def policy_yaml(strategy: str, pin: str, urls: list[str]) -> str:
    replicas = ", ".join(f"{{url: '{u}/v1', name: {n}}}" for n, u in zip(REPLICAS, urls, strict=True))
    return (f"version: 1\nname: {POLICY_NAME}\n"
            f"pools:\n  engines:\n    model: smollm2-135m\n    strategy: {strategy}\n"
            # A long prefill on a loaded CPU must not count as a failure, nor a retry move a turn,
            # nor a health check that times out behind it take a replica out: strategies compared.
            f"    timeout: 900s\n    retries: 0\n    health: {{interval: 0}}\n    replicas: [{replicas}]\n"
            f"session: {{pin: {pin}}}\n"
            f"routes: [{{name: default, pool: engines}}]\n")


class Gateway:
    """`switchyard serve` on one policy file, ready when /health answers."""

    def __init__(self, policy: Path, log: Path) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("w")
        self.p = subprocess.Popen([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(policy),
                                   "--port", str(self.port), "--log-level", "warning", "--no-access-log",
                                   "--no-ui"], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.p.returncode}; see {log}")
            try:
                if _get(self.url + "/health")[0] < 500:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"gateway not ready after 60 s; see {log}")

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


def _start_engines(args: list[str], log_dir: Path, tag: str) -> list[Engine]:
    """Both replicas, started side by side (loading the model is most of a round's fixed cost)."""
    with ThreadPoolExecutor(len(REPLICAS)) as pool:
        futs = [pool.submit(Engine, args, log_dir / f"cache_routing_{tag}_{n}.log") for n in REPLICAS]
    engines = [f.result() for f in futs if f.exception() is None]
    if len(engines) < len(futs):
        for e in engines:
            e.close()
        raise next(f.exception() for f in futs if f.exception() is not None)  # type: ignore[misc]
    return engines


def think_time(mean_s: float, seed: int) -> Callable[[Turn], float]:
    """A pure function of the turn, so that every policy and round replays the same pauses."""
    return lambda t: random.Random(f"{seed}/{t.session}/{t.turn}").uniform(0, 2 * mean_s) if mean_s > 0 else 0.0


def run_policy(name: str, engine_args: list[str], trace: list[list[Turn]], log_dir: Path, r: int,
               think: Callable[[Turn], float]) -> tuple[list[Result], dict[str, Any]]:
    strategy, pin = POLICIES[name]
    engines = _start_engines(engine_args, log_dir, f"{name}_{r}")
    gw = None
    try:
        # One short request each, straight to the engine: a fresh process's first step pays
        # one-off costs. "Hi" shares no block with the trace's prompts.
        warm = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        for eng in engines:
            urllib.request.urlopen(urllib.request.Request(eng.url + "/v1/chat/completions", json.dumps(warm).encode(),
                                                          {"Content-Type": "application/json"}), timeout=300).read()
        policy = log_dir / f"cache_routing_{name}_{r}.yaml"
        policy.write_text(policy_yaml(strategy, pin, [e.url for e in engines]))
        gw = Gateway(policy, log_dir / f"cache_routing_gw_{name}_{r}.log")
        t0 = time.perf_counter()
        results = replay(gw.url + "/v1", trace, concurrency=len(trace), think=think)
        wall = time.perf_counter() - t0
        health = {n: e.health() for n, e in zip(REPLICAS, engines, strict=True)}
    finally:
        if gw is not None:
            gw.close()
        for e in engines:
            e.close()
    counts = Counter(x.headers.get("x-switchyard-replica", "?") for x in results if not x.error)
    served = [counts.get(n, 0) for n in REPLICAS]
    mean = sum(served) / len(served)
    by_session: dict[str, list[str]] = {}
    for x in sorted(results, key=lambda x: (x.session, x.turn)):
        if not x.error:
            by_session.setdefault(x.session, []).append(x.headers.get("x-switchyard-replica", "?"))
    # A turn on another replica than its session's previous turn prefills its history again.
    moves = sum(a != b for v in by_session.values() for a, b in zip(v, v[1:], strict=False))
    later = sum(len(v) - 1 for v in by_session.values())
    info = {"round": r, "policy": name, "wall_s": wall, "served": dict(zip(REPLICAS, served, strict=True)),
            "imbalance": max(served) / mean if mean else float("nan"),
            "sessions_on_one_replica": sum(len(set(v)) == 1 for v in by_session.values()) / max(1, len(by_session)),
            "turns_moved": moves / max(1, later),
            "hit_rate": hit_rate(results), "hit_rate_turn2_on": hit_rate(results, 2),
            "errors": sum(bool(x.error) for x in results),
            "engine_kv": {n: h.get("kv_cache", {}) for n, h in health.items()},
            "device": next(iter(health.values()), {}).get("device", {})}
    return results, info


def p99(xs: list[float]) -> float:
    """Nearest rank: with fewer than 100 turns, the slowest one."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)] if s else float("nan")


def summarize(results: list[Result], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [x for x in results if not x.error]
    ttft = [x.ttft_s for x in ok]
    later = [x.ttft_s for x in ok if x.turn >= 2]
    imb = [x["imbalance"] for x in rounds]
    return {"hit_rate_turn2_on": hit_rate(ok, 2), "hit_rate": hit_rate(ok),
            "ttft_mean_s": statistics.fmean(ttft) if ttft else float("nan"), "ttft_p99_s": p99(ttft),
            "ttft_mean_turn2_on_s": statistics.fmean(later) if later else float("nan"),
            "imbalance_mean": statistics.fmean(imb), "imbalance_max": max(imb),
            "served_per_round": [list(x["served"].values()) for x in rounds],
            "sessions_on_one_replica": statistics.fmean(x["sessions_on_one_replica"] for x in rounds),
            "turns_moved": statistics.fmean(x["turns_moved"] for x in rounds),
            "requests": len(results), "errors": len(results) - len(ok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="each: every policy once, on fresh replicas")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--think-s", type=float, default=2.0,
                    help="mean seconds an agent waits before each turn (uniform in [0, 2x]; 0: closed loop)")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset, in round 1's order")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="torch threads per replica (default: half the cores each: they share the machine)")
    ap.add_argument("--engine-args", default="--max-model-len 4096 --max-num-seqs 8",
                    help="more `engine serve` options (both replicas)")
    ap.add_argument("--quick", action="store_true",
                    help="6 sessions x 3 turns, ~250-token system prompts, 4 tokens out, 1 round: a smoke run")
    ap.add_argument("--out", type=Path, help="JSON out (default bench/results/cache_routing.json; "
                                             "--quick: cache_routing_quick.json)")
    a = ap.parse_args()
    if a.quick:
        a.sessions, a.turns, a.system_tokens, a.max_tokens, a.rounds, a.think_s = 6, 3, 250, 4, 1, 1.0
        a.engine_args = "--max-model-len 2048 --max-num-seqs 4"
    out = a.out or ROOT / "bench" / "results" / ("cache_routing_quick.json" if a.quick else "cache_routing.json")
    names = [n.strip() for n in a.policies.split(",") if n.strip()]
    unknown = set(names) - set(POLICIES)
    if unknown:
        raise SystemExit(f"unknown policies {sorted(unknown)}; known: {', '.join(POLICIES)}")
    # An idle replica's OpenMP workers must not spin on the cores the other one computes on.
    os.environ.setdefault("GOMP_SPINCOUNT", "0")
    trace = make_trace(a.sessions, a.turns, a.system_tokens, a.seed, model=POLICY_NAME, max_tokens=a.max_tokens)
    engine_args = ["--model", "smollm2-135m", "--threads", str(a.threads), *a.engine_args.split()]
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    think = think_time(a.think_s, a.seed)
    results: dict[str, list[Result]] = {n: [] for n in names}
    rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            res, info = run_policy(name, engine_args, trace, logs, r, think)
            results[name].extend(res)
            rounds[name].append(info)
            print(f"round {r + 1} {name}: {info['wall_s']:.0f} s, hit rate {info['hit_rate_turn2_on']:.3f} "
                  f"(turns 2+), served {info['served']}, errors {info['errors']}", file=sys.stderr)
            if info["errors"]:
                print("  first error: " + next(x.error for x in res if x.error), file=sys.stderr)

    summary = {n: summarize(results[n], rounds[n]) for n in names}
    dev = next(iter(rounds[names[0]]), {}).get("device", {})
    print(f"\nCPU: {_cpu()}, {os.cpu_count()} cores; 2 replicas x {a.threads} thread(s); native build: "
          f"{dev.get('int4_kernel', '-')}, KV cache {dev.get('kv_cache_dtype', '-')}; {a.sessions} concurrent "
          f"sessions x {a.turns} turns, ~{a.system_tokens}-token system prompts, {a.max_tokens} tokens out, "
          f"think time {a.think_s:g} s mean, {a.rounds} round(s){' (quick)' if a.quick else ''}\n")
    print("| policy | hit rate, turns 2+ | hit rate, all turns | mean TTFT | p99 TTFT | mean TTFT, turns 2+ "
          "| sessions on one replica | turns moved | imbalance (mean, max) | requests per replica, per round | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, s in summary.items():
        served = ", ".join("/".join(map(str, x)) for x in s["served_per_round"])
        print(f"| {n} | {s['hit_rate_turn2_on']:.3f} | {s['hit_rate']:.3f} | {s['ttft_mean_s'] * 1000:.0f} ms | "
              f"{s['ttft_p99_s'] * 1000:.0f} ms | {s['ttft_mean_turn2_on_s'] * 1000:.0f} ms | "
              f"{s['sessions_on_one_replica']:.2f} | {s['turns_moved']:.2f} | {s['imbalance_mean']:.2f}, {s['imbalance_max']:.2f} | "
              f"{served} | {s['errors']} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"quick": a.quick, "args": vars(a) | {"out": str(out)}, "cpu": _cpu(),
                               "cores": os.cpu_count(), "device": dev, "summary": summary, "rounds": rounds,
                               "results": {n: [asdict(x) for x in v] for n, v in results.items()}},
                              indent=1, default=str))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
