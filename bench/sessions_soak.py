"""Many live agent sessions against none, in one run (issue #34): req/s, p50/p99, RSS over time
and the gateway's GC pauses.

    python bench/sessions_soak.py                       # no sessions / 200k live / 1M live (raised cap)
    python bench/sessions_soak.py --caps 200000         # only the 200k store
    python bench/sessions_soak.py --redis               # the gateways share state in a private redis-server
    python bench/sessions_soak.py --before ../before    # plus the tree before the fix at the first cap, same run
    python bench/sessions_soak.py --tree ../before      # every gateway from another source tree
    python bench/sessions_soak.py --quick               # a smoke run: 20k cap, 5 s phases

Layout on a 2-core machine: the stub upstream (tests/fake_upstream.py), redis-server and wrk on
core 0; the gateways alone on core 1, all up at once, only one loaded at a time. One gateway is
sent no session ids; the others a fresh `x-session-id` on every request (wrk, one Lua script),
after a fill phase that takes their stores to the cap (each's `--max-sessions`). Then rounds of
`--phase-s` seconds each: plain, then streamed, each gateway in turn, c=32, so the machine's
drift falls on every gateway alike. Every gateway runs inside this script (`--as-gateway`),
which times each GC pass with gc.callbacks and writes them to a file; RSS from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gateway_overhead import cpu_seconds, free_port, spawn, stop, wait_http, wait_redis  # noqa: E402

BODY = {"model": "auto", "messages": [{"role": "user", "content": "What is the weather in Paris today?"}],
        "max_tokens": 16}

LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [[BODY]]
local fresh = FRESH
local prefix = "PREFIX"
local n = 0
request = function()
  if fresh then
    n = n + 1
    wrk.headers["x-session-id"] = prefix .. n
  end
  return wrk.format()
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('JSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, '
    .. '"errors": %d, "non2xx": %d}\\n', summary.requests, summary.duration, latency:percentile(50),
    latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
"""


# --- inside the gateway process ---------------------------------------------------------------

def as_gateway(gclog: str, cap: int, argv: list[str]) -> None:
    """Run `switchyard serve ARGV` here, with every GC pass timed into `gclog` (JSON lines) and
    the in-memory session cap set to `cap` (the default argument, so a tree without
    --max-sessions takes it too)."""
    import gc

    # (time, generation, wall seconds, this thread's CPU seconds, objects collected): on a shared
    # machine the wall time includes being descheduled mid-pass, the CPU time is the pass's own work.
    pauses: list[tuple[float, int, float, float, int]] = []
    t0 = [0.0, 0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            t0[0], t0[1] = time.perf_counter(), time.thread_time()
        else:
            pauses.append((time.time(), info["generation"], time.perf_counter() - t0[0], time.thread_time() - t0[1],
                           info["collected"]))

    gc.callbacks.append(on_gc)

    def writer() -> None:
        done = 0
        with open(gclog, "a") as f:
            while True:
                time.sleep(1.0)
                new = pauses[done:]
                done += len(new)
                for p in new:
                    f.write(json.dumps(p) + "\n")
                f.flush()

    threading.Thread(target=writer, daemon=True).start()
    if cap:
        from switchyard.state import memory

        d = list(memory.MemoryStore.__init__.__defaults__ or ())
        d[0] = cap
        memory.MemoryStore.__init__.__defaults__ = tuple(d)
    prefill = int(os.environ.get("SOAK_PREFILL", "0"))
    if prefill:
        _prefill_on_first_put(prefill)
    sys.argv = ["switchyard", *argv]
    from switchyard.cli import app

    app()


def _prefill_on_first_put(n: int) -> None:
    """The store's first session write (a request's, after start-up and its gc.freeze()) first
    writes `n` sessions as routing makes them (a key per policy, caller and id; a record like the
    request's): a 1M store filled in seconds rather than minutes of traffic. Sessions only in
    this gateway's memory (with --redis, not in Redis)."""
    import uuid

    from switchyard.state import memory

    orig = memory.MemoryStore.put_session_now

    def put(self, session_id, record, ttl):  # noqa: ANN001, ANN202
        if not getattr(self, "_soak_filled", False):
            self._soak_filled = True
            t = time.perf_counter()
            for i in range(n):
                rec = type(record)(record.policy, record.pool, record.label, record.confidence, record.replica,
                                   record.rule, record.turns)
                orig(self, f"{record.policy}\0\0{uuid.uuid4()}-{i}", rec, ttl)
            print(f"prefilled {n:,} sessions in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
            # The store's own method again: this wrapper must not cost the gateways given fresh ids
            # a frame and a getattr on every write of the measured phases.
            memory.MemoryStore.put_session_now = orig
        return orig(self, session_id, record, ttl)

    memory.MemoryStore.put_session_now = put


# --- the driver ------------------------------------------------------------------------------

def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def wrk(url: str, seconds: float, stream: bool, fresh: bool, prefix: str, tmp: Path, conns: int = 32) -> dict:
    body = json.dumps({**BODY, "stream": stream})
    script = tmp / f"{prefix}.lua"
    script.write_text(LUA.replace("BODY", body).replace("FRESH", "true" if fresh else "false")
                      .replace("PREFIX", prefix))
    cmd = ["taskset", "-c", "0", "wrk", "-t1", f"-c{conns}", f"-d{int(seconds)}s", "--timeout", "10s", "-s",
           str(script), url + "/v1/chat/completions"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    for line in out.splitlines():
        if line.startswith("JSON "):
            r = json.loads(line[5:])
            r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
            r["p50_ms"], r["p99_ms"] = r.pop("p50_us") / 1000, r.pop("p99_us") / 1000
            return r
    raise RuntimeError(f"wrk said nothing useful:\n{out}")


class Sampler(threading.Thread):
    """RSS of every gateway every `every` seconds, with the phase that was running."""

    def __init__(self, pids: dict[str, int], every: float = 5.0):
        super().__init__(daemon=True)
        self.pids, self.every = pids, every
        self.phase = "start"
        self.t0 = time.time()
        self.rows: list[dict] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.rows.append({"t": round(time.time() - self.t0, 1), "phase": self.phase,
                              **{n: round(rss_mb(p), 1) for n, p in self.pids.items()}})
            self.halt.wait(self.every)


def gc_stats(path: Path, windows: list[tuple[float, float]]) -> dict:
    """The GC passes that began inside the measured windows."""
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    rows = [r for r in rows if any(a <= r[0] <= b for a, b in windows)]
    span = sum(b - a for a, b in windows) or 1.0
    out: dict = {"passes": len(rows), "ms_per_s": round(sum(r[2] for r in rows) * 1000 / span, 3),
                 "cpu_ms_per_s": round(sum(r[3] for r in rows) * 1000 / span, 3)}
    for gen in (0, 1, 2):
        ds = sorted(r[2] * 1000 for r in rows if r[1] == gen)
        cs = sorted(r[3] * 1000 for r in rows if r[1] == gen)
        out[f"gen{gen}"] = {"n": len(ds), "max_ms": round(ds[-1], 2) if ds else 0.0,
                            "cpu_max_ms": round(cs[-1], 2) if cs else 0.0,
                            "cpu_median_ms": round(statistics.median(cs), 3) if cs else 0.0}
    return out


def sessions_held(url: str, admin: str) -> int | None:
    req = urllib.request.Request(url + "/health", headers={"Authorization": f"Bearer {admin}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            h = json.loads(r.read())
    except Exception:
        return None
    st = h.get("state") or {}
    return st.get("sessions", (st.get("local") or {}).get("sessions"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--caps", default="200000,1000000", help="session caps of the gateways given fresh ids")
    ap.add_argument("--phase-s", type=float, default=30.0, help="seconds of one measured phase")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (plain, streamed) phases per gateway")
    ap.add_argument("--fill-rate", type=float, default=2500.0, help="guess of req/s while filling (fill in chunks)")
    ap.add_argument("--fill", choices=("prefill", "traffic"), default="prefill",
                    help="prefill: the store written to its cap inside the gateway at the first request, then "
                         "10 s of traffic; traffic: fresh ids through wrk until the cap (1M: minutes)")
    ap.add_argument("--redis", action="store_true", help="the gateways share state in a private redis-server")
    ap.add_argument("--tree", type=Path, help="run the gateways from this source tree (e.g. a worktree before a fix)")
    ap.add_argument("--before", type=Path, help="also a gateway of this source tree given fresh ids at the first cap "
                                                "(the same run: before and after side by side)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: one 20k store, 5 s phases, one round")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sessions_soak.json")
    args = ap.parse_args()
    if args.quick:
        args.caps, args.phase_s, args.rounds = "20000", 5.0, 1
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], capture_output=True)
    if not shutil.which("wrk"):
        sys.exit("wrk is needed (apt-get install wrk)")
    caps = [int(c) for c in args.caps.split(",") if c]
    tmp = Path(tempfile.mkdtemp(prefix="sy-soak-"))
    procs: list[subprocess.Popen] = []
    run_id = os.urandom(12).hex()  # with the counter, ids as long as a uuid
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "cpu": cpu_name(), "gateways": {}}
    try:
        up = free_port()
        procs.append(spawn([sys.executable, str(ROOT / "tests" / "fake_upstream.py"), "--port", str(up),
                            "--name", "up0"], core=0))
        wait_http(f"http://127.0.0.1:{up}/health")
        policy = tmp / "soak.yaml"
        policy.write_text("version: 1\nname: soak\npools:\n  p:\n    model: fake\n    replicas:\n"
                          f"      - url: http://127.0.0.1:{up}/v1\n"
                          "routes:\n  - name: default\n    pool: p\nsession:\n  pin: pool\n  ttl: 2h\n")
        extra: list[str] = []
        if args.redis:
            rport = free_port()
            procs.append(spawn(["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"], core=0))
            wait_redis(rport, procs[-1])
            extra = ["--redis", f"redis://127.0.0.1:{rport}/0"]
        gws: dict[str, dict] = {}
        trees: list[tuple[str, int, Path | None]] = [("no sessions", 0, args.tree)]
        trees += [(f"fresh ids, cap {c:,}", c, args.tree) for c in caps]
        if args.before:
            trees.append((f"before: fresh ids, cap {caps[0]:,}", caps[0], args.before))
        for name, cap, src in trees:
            tree = src.resolve() if src else ROOT
            has_cap = "max_sessions" in (tree / "switchyard" / "api" / "cli.py").read_text()
            genv = ({"PYTHONPATH": str(tree)} if src else {}) | (
                {"SOAK_PREFILL": str(cap)} if cap and args.fill == "prefill" else {})
            port = free_port()
            gclog = tmp / f"gc-{port}.jsonl"
            p = spawn([sys.executable, str(Path(__file__).resolve()), "--as-gateway", str(gclog), str(cap or 200_000),
                       "serve", "--policy", str(policy), "--port", str(port), "--log-level", "warning",
                       "--admin-key", "soak-admin", "--no-health-checks", *extra,
                       *(["--max-sessions", str(cap or 200_000)] if has_cap else [])],
                      core=1, env=genv, log=tmp / f"gw-{port}.log", cwd=tree if src else None)
            procs.append(p)
            wait_http(f"http://127.0.0.1:{port}/health/live", proc=p)
            gws[name] = {"url": f"http://127.0.0.1:{port}", "pid": p.pid, "cap": cap, "gclog": gclog,
                         "fresh": cap > 0, "phases": [], "windows": []}
        sampler = Sampler({n: g["pid"] for n, g in gws.items()})
        sampler.start()
        for name, g in gws.items():  # fill: fresh ids until the store holds its cap (and 5% more were sent)
            if not g["fresh"]:
                continue
            sent, t0 = 0, time.time()
            sampler.phase = f"fill {name}"
            target = g["cap"] * 1.05 if args.fill == "traffic" else 1
            while sent < target:  # prefill: one 10 s phase (the first request fills the store)
                secs = min(60, max(5, (target - sent) / args.fill_rate)) if args.fill == "traffic" else 10
                r = wrk(g["url"], secs, False, True, f"{run_id}f{sent}", tmp)
                sent += r["requests"]
            g["fill"] = {"requests": sent, "seconds": round(time.time() - t0, 1),
                         "rss_mb": round(rss_mb(g["pid"]), 1), "sessions": sessions_held(g["url"], "soak-admin")}
            print(f"filled {name}: {sent:,} requests in {g['fill']['seconds']} s, RSS {g['fill']['rss_mb']} MB, "
                  f"sessions {g['fill']['sessions']}", flush=True)
        for rnd in range(args.rounds):
            for stream in (False, True):
                for name, g in gws.items():
                    kind = "streamed" if stream else "plain"
                    sampler.phase = f"{kind} {name}"
                    a, c0 = time.time(), cpu_seconds(g["pid"])
                    r = wrk(g["url"], args.phase_s, stream, g["fresh"], f"{run_id}r{rnd}{kind[0]}", tmp)
                    g["windows"].append((a, time.time()))
                    # The gateway's own CPU a request: what a shared machine disturbs least.
                    cpu_us = (cpu_seconds(g["pid"]) - c0) / max(1, r["requests"]) * 1e6
                    r.update(kind=kind, round=rnd, rss_mb=round(rss_mb(g["pid"]), 1), cpu_us=round(cpu_us, 1))
                    g["phases"].append(r)
                    print(f"round {rnd} {kind:>8} {name:>22}: {r['rps']:7.0f} req/s  p50 {r['p50_ms']:6.2f} ms  "
                          f"p99 {r['p99_ms']:7.2f} ms  CPU {r['cpu_us']:6.0f} us/req  RSS {r['rss_mb']:6.1f} MB  errors {r['errors']} "
                          f"non-2xx {r['non2xx']}", flush=True)
        sampler.halt.set()
        results["rss"] = sampler.rows
        base = gws["no sessions"]
        for name, g in gws.items():
            summary = summarize(g, base)
            summary["gc"] = gc_stats(g["gclog"], g["windows"])
            summary["sessions_end"] = sessions_held(g["url"], "soak-admin")
            results["gateways"][name] = {k: v for k, v in g.items() if k not in ("gclog", "windows", "pid")} | summary
            s = summary
            print(f"{name:>22}: CPU a request plain {s['cpu_us_plain']:.0f} us ({s['cpu_plain_ratio']:.2f}x), streamed "
                  f"{s['cpu_us_streamed']:.0f} us ({s['cpu_streamed_ratio']:.2f}x)", flush=True)
            print(f"{name:>22}: {s['rps']:7.0f} req/s ({s['rps_ratio']:.2f}x)  p99 plain {s['p99_plain_ms']:.1f} ms "
                  f"({s['p99_plain_ratio']:.2f}x), streamed {s['p99_streamed_ms']:.1f} ms "
                  f"({s['p99_streamed_ratio']:.2f}x)  RSS {s['rss_first_mb']:.0f} -> {s['rss_last_mb']:.0f} MB  "
                  f"GC {s['gc']['ms_per_s']} ms/s ({s['gc']['cpu_ms_per_s']} CPU), gen2 {s['gc']['gen2']['n']} passes, "
                  f"max {s['gc']['gen2']['max_ms']} ms ({s['gc']['gen2']['cpu_max_ms']} CPU)", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.out}")
    finally:
        for p in reversed(procs):
            stop(p)


def summarize(g: dict, base: dict) -> dict:
    def med(gw: dict, kind: str, key: str) -> float:
        return statistics.median(p[key] for p in gw["phases"] if p["kind"] == kind)

    rps = statistics.mean(p["rps"] for p in g["phases"])
    brps = statistics.mean(p["rps"] for p in base["phases"])
    out = {"rps": round(rps, 1), "rps_ratio": round(rps / brps, 3)}
    for kind in ("plain", "streamed"):
        for key in ("p50_ms", "p99_ms"):
            v = med(g, kind, key)
            out[f"{key[:3]}_{kind}_ms"] = round(v, 2)
            out[f"{key[:3]}_{kind}_ratio"] = round(v / med(base, kind, key), 3)
    for kind in ("plain", "streamed"):
        v = med(g, kind, "cpu_us")
        out[f"cpu_us_{kind}"] = round(v, 1)
        out[f"cpu_{kind}_ratio"] = round(v / med(base, kind, "cpu_us"), 3)
    out["rss_first_mb"] = g["phases"][0]["rss_mb"]
    out["rss_last_mb"] = g["phases"][-1]["rss_mb"]
    return out


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--as-gateway":
        as_gateway(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    else:
        main()
