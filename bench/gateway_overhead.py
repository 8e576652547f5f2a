"""What the gateway adds to a request, against a direct call, a bare forwarder and LiteLLM, in one run.

    python bench/gateway_overhead.py                 # everything (installs wrk and LiteLLM if missing)
    python bench/gateway_overhead.py --no-litellm    # skip the peer
    python bench/gateway_overhead.py --redis         # also: the gateway with shared state in Redis
    python bench/gateway_overhead.py --tracing --no-litellm --rounds 5   # tracing off vs on, alternating
    python bench/gateway_overhead.py --alternate 5   # direct, bare forwarder and switchyard in 5 alternating rounds
                                                     # (their c=1 requests interleaved one by one)

Layout on a 2-core machine: the fast upstream(s) and the load generator on core 0, the server
under test (gateway / bare forwarder / LiteLLM) alone on core 1, one at a time.
Concurrency 1: N sequential non-streaming requests (aiohttp client, this process, on core 0), added latency = p50/p99
through the server minus direct. Streaming: time to first byte, same subtraction.
Throughput: wrk, 32 connections, 10 s, POST of a small chat body.
--tracing: the gateway with OpenTelemetry tracing off and on (every request sampled, spans sent by
OTLP/HTTP to a sink on core 0), alternating round by round; figures are medians of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "auto", "messages": [{"role": "user", "content": "What is the weather in Paris today?"}],
        "max_tokens": 16}
LITELLM_VENV = Path(os.environ.get("SWITCHYARD_BENCH_VENV", Path.home() / ".cache" / "switchyard" / "litellm-venv"))
LITELLM_VERSION = os.environ.get("LITELLM_VERSION", "1.108.7")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(cmd: list[str], core: int | None, env: dict | None = None, log: Path | None = None,
          cwd: Path | None = None) -> subprocess.Popen:
    if core is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(core), *cmd]
    out = log.open("w") if log else subprocess.DEVNULL
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=cwd)


def client_on_core0() -> None:
    """The sequential (c=1) client is this process: beside the upstream and wrk on core 0, as the
    layout says, not wherever the scheduler puts it (on the server's core it would queue behind
    the server it times, one run in some rounds and not in others)."""
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() >= 2:
        os.sched_setaffinity(0, {0})


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None, poll: float = 0.2) -> None:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status < 500:
                    return
        except Exception:
            time.sleep(poll)
    raise RuntimeError(f"{url} did not come up in {timeout}s")


def wait_redis(port: int, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode} (is it installed?)")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server did not answer on port {port}")


def stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()


def pctl(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def latency(url: str, n: int, model: str, headers: dict | None = None) -> list[float]:
    """N sequential requests (ms each, after 50 of warm-up)."""
    return (await latency_interleaved([url], n, model, headers))[0]


async def latency_interleaved(urls: list[str], n: int, model: str, headers: dict | None = None) -> list[list[float]]:
    """N sequential requests to each URL, taking turns request by request (each through its own
    connection): a drift in the machine's speed falls on every URL alike, so their p50s compare
    within a round rather than across the seconds between one URL's run and the next's."""
    body = json.dumps({**BODY, "model": model}).encode()
    h = {"Content-Type": "application/json", **(headers or {})}
    out: list[list[float]] = [[] for _ in urls]
    sessions = [aiohttp.ClientSession() for _ in urls]
    try:
        for i in range(n + 50):
            for k, (s, url) in enumerate(zip(sessions, urls, strict=True)):
                t = time.perf_counter()
                async with s.post(url, data=body, headers=h) as r:
                    await r.read()
                    assert r.status == 200, (r.status, await r.text())
                if i >= 50:  # warm-up
                    out[k].append((time.perf_counter() - t) * 1000)
    finally:
        for s in sessions:
            await s.close()
    return out


async def ttfb(url: str, n: int, model: str, headers: dict | None = None) -> list[float]:
    body = json.dumps({**BODY, "model": model, "stream": True}).encode()
    h = {"Content-Type": "application/json", **(headers or {})}
    out = []
    async with aiohttp.ClientSession() as s:
        for i in range(n + 20):
            t = time.perf_counter()
            async with s.post(url, data=body, headers=h) as r:
                await r.content.readany()
                first = time.perf_counter()
                await r.read()
            if i >= 20:
                out.append((first - t) * 1000)
    return out


async def overhead_header(url: str, n: int, headers: dict | None = None) -> list[float]:
    """x-switchyard-overhead-ms of N sequential requests: what the gateway measured it added."""
    body = json.dumps(BODY).encode()
    h = {"Content-Type": "application/json", **(headers or {})}
    out = []
    async with aiohttp.ClientSession() as s:
        for i in range(n + 50):
            async with s.post(url, data=body, headers=h) as r:
                await r.read()
                if i >= 50:
                    out.append(float(r.headers["x-switchyard-overhead-ms"]))
    return out


def ensure_wrk() -> str | None:
    if shutil.which("wrk"):
        return "wrk"
    print("installing wrk (apt-get) ...", flush=True)
    subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], capture_output=True)
    return "wrk" if shutil.which("wrk") else None


def wrk_rps(url: str, model: str, conns: int, seconds: int, headers: dict | None = None) -> float:
    body = json.dumps({**BODY, "model": model})
    hdrs = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in (headers or {}).items())
    script = f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\nwrk.headers["Content-Type"] = "application/json"\n{hdrs}'
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "-s", f.name, url]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    non2xx = 0
    for line in out.splitlines():
        if "Non-2xx" in line:
            non2xx = int(line.split()[-1])
        if line.startswith("Requests/sec:"):
            rps = float(line.split()[1])
    if non2xx:
        print(f"  warning: {non2xx} non-2xx answers from {url}", flush=True)
    return rps


def ensure_litellm() -> Path | None:
    py = LITELLM_VENV / "bin" / "python"
    if not (LITELLM_VENV / "bin" / "litellm").exists():
        print(f"installing LiteLLM {LITELLM_VERSION} into {LITELLM_VENV} (one time) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("  LiteLLM install failed:", r.stderr[-400:], flush=True)
            return None
    return LITELLM_VENV / "bin" / "litellm"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(name: str, url: str, model: str, args, results: dict, headers: dict | None = None,
            proc: subprocess.Popen | None = None, lat: list[float] | None = None) -> None:
    if lat is None:
        lat = asyncio.run(latency(url + "/chat/completions", args.requests, model, headers))
    tt = asyncio.run(ttfb(url + "/chat/completions", args.requests // 4, model, headers))
    rps, per_core = float("nan"), float("nan")
    if args.wrk:
        c0, t0 = (cpu_seconds(proc.pid) if proc else 0.0), time.perf_counter()
        rps = wrk_rps(url + "/chat/completions", model, 32, args.seconds, headers)
        if proc is not None:  # requests per CPU-second of the server: robust to a busy machine
            used = cpu_seconds(proc.pid) - c0
            per_core = rps * (time.perf_counter() - t0) / used if used > 0 else float("nan")
    results[name] = {"p50": statistics.median(lat), "p99": pctl(lat, 0.99), "ttfb_p50": statistics.median(tt),
                     "rps": rps, "rps_per_cpu_second": per_core}
    r = results[name]
    print(f"{name:>18}: p50 {r['p50']:.3f} ms  p99 {r['p99']:.3f} ms  ttfb p50 {r['ttfb_p50']:.3f} ms  "
          f"{r['rps']:.0f} req/s at c=32 ({per_core:.0f} per CPU-second)", flush=True)


BARE_FORWARDER = '''
import sys, aiohttp, uvicorn
from fastapi import FastAPI, Request
from starlette.responses import Response
up = sys.argv[2]
app = FastAPI()
sess = None
@app.post("/v1/chat/completions")
async def fwd(request: Request):
    global sess
    if sess is None:
        sess = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    body = await request.body()
    async with sess.post(up + "/chat/completions", data=body, headers={"Content-Type": "application/json"}) as r:
        data = await r.read()
    return Response(data, r.status, media_type="application/json")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
            log_level="warning", access_log=False)
'''


OTLP_SINK = '''
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def tracing_rounds(args, policy: Path, tmp: Path, results: dict) -> None:
    """The gateway with tracing off and on, alternating, `args.rounds` times; medians kept."""
    sp = free_port()
    script = tmp / "otlp_sink.py"
    script.write_text(OTLP_SINK)
    sink = spawn([sys.executable, str(script), str(sp)], core=0, log=tmp / "sink.log")
    wait_http(f"http://127.0.0.1:{sp}/", proc=sink)
    on_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sp}", "OTEL_TRACES_SAMPLER": "always_on"}
    variants: list[tuple[str, list[str], dict, Path | None]] = [
        ("tracing off", ["--no-otel"], {}, None), ("tracing on", ["--otel"], on_env, None)]
    if args.before:  # another source tree (an older commit), run from its own folder
        variants.insert(0, ("before", [], {}, args.before.resolve()))
    rounds: dict[str, list[dict]] = {name: [] for name, *_ in variants}
    try:
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]  # each goes first in turn
            for name, extra, env, cwd in order:
                gp = free_port()
                gw = spawn([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(policy), "--port", str(gp),
                            "--log-level", "warning", *extra], core=1, env=env, log=tmp / f"{name}-{r}.log", cwd=cwd)
                wait_http(f"http://127.0.0.1:{gp}/health", proc=gw)
                one: dict = {}
                measure(f"{name} #{r + 1}", f"http://127.0.0.1:{gp}/v1", "auto", args, one, proc=gw)
                ov = asyncio.run(overhead_header(f"http://127.0.0.1:{gp}/v1/chat/completions", args.requests))
                res = one[f"{name} #{r + 1}"]
                res["overhead_hdr_p50"] = statistics.median(ov)
                res["overhead_hdr_p99"] = pctl(ov, 0.99)
                rounds[name].append(res)
                stop(gw)
    finally:
        stop(sink)
    for name, rs in rounds.items():
        results[f"switchyard, {name}"] = medians(rs)


def medians(rounds: list[dict]) -> dict:
    """Each figure's median over the rounds, the rounds themselves kept beside."""
    return {k: statistics.median(x[k] for x in rounds) for k in rounds[0]} | {"rounds": rounds}


def write_results(out: Path, results: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nraw figures: {out}")

def bench_policy(ups: list[str], pin: bool) -> str:
    """One pool of the test upstreams, one route. With `pin`, requests with a session id read and
    write their session (in Redis with --redis); requests without one never touch sessions."""
    return ("version: 1\nname: bench\npools:\n  p:\n    model: fake\n    replicas:\n"
            + "".join(f"      - url: {u}\n" for u in ups)
            + "routes:\n  - name: default\n    pool: p\n" + ("session:\n  pin: pool\n" if pin else ""))


def ab_rounds(args, policy: Path, tmp: Path, results: dict) -> None:
    """This tree's gateway against --ab's, both up at once on the same core, in rounds of
    sequential requests taking turns request by request (which goes first alternating by round):
    per round each one's p50 and its CPU time per request (the server's own /proc counters: what a
    busy machine disturbs least), then the medians of the paired per-round differences."""
    gws = {}
    for name, cwd in (("this tree", None), ("--ab tree", args.ab.resolve())):
        gp = free_port()
        gws[name] = (gp, spawn([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(policy), "--port",
                                str(gp), "--log-level", "warning"], core=1, log=tmp / f"ab-{gp}.log", cwd=cwd))
        wait_http(f"http://127.0.0.1:{gp}/health", proc=gws[name][1])
    per: dict[str, list[tuple[float, float]]] = {name: [] for name in gws}
    try:
        names = list(gws)
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            c0 = [cpu_seconds(gws[name][1].pid) for name in order]
            lats = asyncio.run(latency_interleaved(
                [f"http://127.0.0.1:{gws[name][0]}/v1/chat/completions" for name in order], args.requests, "auto"))
            for name, lat, c in zip(order, lats, c0, strict=True):
                cpu_us = (cpu_seconds(gws[name][1].pid) - c) / (len(lat) + 50) * 1e6
                per[name].append((statistics.median(lat), cpu_us))
    finally:
        for _, proc in gws.values():
            stop(proc)
    a, b = per["this tree"], per["--ab tree"]
    dp = [x[0] - y[0] for x, y in zip(a, b, strict=True)]
    dc = [x[1] - y[1] for x, y in zip(a, b, strict=True)]
    results["ab"] = {"rounds": args.rounds, "requests": args.requests, "this": a, "ab": b,
                     "p50_delta_median_ms": statistics.median(dp), "cpu_us_delta_median": statistics.median(dc)}
    for name, xs in per.items():
        print(f"  {name:>10}: p50 per round {' '.join(f'{x[0]:.3f}' for x in xs)} ms; "
              f"CPU per request {' '.join(f'{x[1]:.0f}' for x in xs)} us", flush=True)
    print(f"  this tree - --ab tree, medians of {args.rounds} paired rounds: p50 {statistics.median(dp):+.3f} ms "
          f"(rounds {min(dp):+.3f} to {max(dp):+.3f}), CPU per request {statistics.median(dc):+.1f} us "
          f"({statistics.median(x[1] for x in a):.0f} vs {statistics.median(x[1] for x in b):.0f} us)", flush=True)


def alternating_rounds(args, ups: list[str], tmp: Path, results: dict) -> None:
    """Direct, the bare forwarder and the gateway, all up at once (servers on core 1), measured in
    `args.alternate` rounds whose order rotates; each figure is the median of its rounds, and the
    two ratios the per-core goal names are medians of the per-round ratios. Within a round the
    sequential requests take turns request by request (latency_interleaved)."""
    bp, gp = free_port(), free_port()
    script = tmp / "bare.py"
    script.write_text(BARE_FORWARDER)
    policy = tmp / "alt.yaml"
    # The gateway's pool is the one upstream that the direct call and the forwarder reach: with a
    # second replica its requests would alternate between two upstream processes, each woken half
    # as often as the direct call's, and the subtraction would charge that to the gateway.
    policy.write_text(bench_policy(ups[:1], pin=False))
    bare = spawn([sys.executable, str(script), str(bp), ups[0]], core=1, log=tmp / "bare.log")
    gw = spawn([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(policy), "--port", str(gp),
                "--log-level", "warning"], core=1, log=tmp / "alt-gw.log")
    servers = [("direct", ups[0], None), ("bare forwarder", f"http://127.0.0.1:{bp}/v1", bare),
               ("switchyard", f"http://127.0.0.1:{gp}/v1", gw)]
    try:
        wait_http(f"http://127.0.0.1:{bp}/docs", proc=bare)
        wait_http(f"http://127.0.0.1:{gp}/health", proc=gw)
        rounds: dict[str, list[dict]] = {name: [] for name, *_ in servers}
        for r in range(args.alternate):
            k = r % len(servers)
            order = servers[k:] + servers[:k]
            lats = asyncio.run(latency_interleaved([u + "/chat/completions" for _, u, _ in order], args.requests,
                                                   "auto"))
            for (name, url, proc), lat in zip(order, lats, strict=True):
                one: dict = {}
                measure(f"{name} #{r + 1}", url, "auto", args, one, proc=proc, lat=lat)
                rounds[name].append(one[f"{name} #{r + 1}"])
    finally:
        stop(bare)
        stop(gw)
    for name, rs in rounds.items():
        results[name] = medians(rs)
    d, b, s = rounds["direct"], rounds["bare forwarder"], rounds["switchyard"]
    added = [(si["p50"] - di["p50"]) / max(bi["p50"] - di["p50"], 1e-6) for di, bi, si in zip(d, b, s, strict=True)]
    rps = [si["rps"] / bi["rps"] for bi, si in zip(b, s, strict=True)]
    results["alternating"] = {"rounds": args.alternate, "added_p50_ratio_per_round": added, "rps_ratio_per_round": rps,
                              "added_p50_ratio": statistics.median(added), "rps_ratio": statistics.median(rps)}
    print(f"  switchyard's added p50 / the forwarder's, per round: {' '.join(f'{x:.2f}' for x in added)} "
          f"(median {statistics.median(added):.2f}x; goal <= 0.7x); its req/s at c=32 / the forwarder's: "
          f"{' '.join(f'{x:.2f}' for x in rps)} (median {statistics.median(rps):.2f}x; goal >= 1.5x)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="sequential requests for the latency figures")
    ap.add_argument("--seconds", type=int, default=10, help="wrk duration")
    ap.add_argument("--no-litellm", action="store_true")
    ap.add_argument("--redis", action="store_true", help="also run the gateway with --redis (a private redis-server)")
    ap.add_argument("--tracing", action="store_true", help="also: the gateway with tracing off and on, alternating")
    ap.add_argument("--rounds", type=int, default=3, help="--tracing: rounds of off/on")
    ap.add_argument("--alternate", type=int, default=0, help="direct, the bare forwarder and the gateway in this many "
                                                             "rounds, order rotating, medians kept (0: one pass each)")
    ap.add_argument("--before", type=Path, help="--tracing: also the gateway of this source tree (e.g. a worktree of "
                                                "the commit before tracing), in the same rounds")
    ap.add_argument("--ab", type=Path, help="only: this tree's gateway against this source tree's, rounds "
                                            "of --requests sequential requests each, taking turns request by request (--rounds of them)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateway_overhead.json")
    args = ap.parse_args()
    client_on_core0()
    args.wrk = ensure_wrk() is not None
    if not args.wrk:
        print("wrk is not available: throughput figures are skipped", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="sy-bench-"))
    procs: list[subprocess.Popen] = []
    results: dict[str, dict] = {}
    try:
        ports = [free_port(), free_port()]
        for i, p in enumerate(ports):
            procs.append(spawn([sys.executable, str(ROOT / "tests" / "fake_upstream.py"), "--port", str(p),
                                "--name", f"up{i}"], core=0))
        for p in ports:
            wait_http(f"http://127.0.0.1:{p}/health")
        ups = [f"http://127.0.0.1:{p}/v1" for p in ports]
        if args.ab:
            policy = tmp / "ab.yaml"
            policy.write_text(bench_policy(ups, pin=False))
            ab_rounds(args, policy, tmp, results)
            args.out.write_text(json.dumps(results, indent=1))
            return
        if args.alternate:
            alternating_rounds(args, ups, tmp, results)
            write_results(args.out, results)
            return
        measure("direct", ups[0], "auto", args, results)

        bp = free_port()
        script = tmp / "bare.py"
        script.write_text(BARE_FORWARDER)
        bare = spawn([sys.executable, str(script), str(bp), ups[0]], core=1, log=tmp / "bare.log")
        wait_http(f"http://127.0.0.1:{bp}/docs", proc=bare)
        measure("bare forwarder", f"http://127.0.0.1:{bp}/v1", "auto", args, results, proc=bare)
        stop(bare)

        policy = tmp / "bench.yaml"
        policy.write_text(bench_policy(ups, pin=True))
        session = {"x-session-id": "bench-session"}
        variants: list[tuple[str, list[str], dict | None]] = [("switchyard", [], None)]
        redis_proc = None
        if args.redis:
            rport = free_port()
            redis_proc = spawn(["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"], core=0)
            wait_redis(rport, redis_proc)
            rurl = ["--redis", f"redis://127.0.0.1:{rport}/0"]
            variants += [("switchyard+redis", rurl, None), ("switchyard+session", [], session),
                         ("sy+redis+session", rurl, session)]
        for name, extra, headers in variants:
            gp = free_port()
            gw = spawn([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(policy), "--port", str(gp),
                        "--log-level", "warning", *extra], core=1, log=tmp / f"{name}.log")
            wait_http(f"http://127.0.0.1:{gp}/health", proc=gw)
            measure(name, f"http://127.0.0.1:{gp}/v1", "auto", args, results, headers, proc=gw)
            if args.redis:  # the gateway's own account, free of the client's and the machine's noise
                ov = asyncio.run(overhead_header(f"http://127.0.0.1:{gp}/v1/chat/completions", args.requests, headers))
                results[name]["overhead_hdr_p50"] = statistics.median(ov)
                results[name]["overhead_hdr_p99"] = pctl(ov, 0.99)
                print(f"{'':>18}  x-switchyard-overhead-ms p50 {statistics.median(ov):.3f} ms  p99 {pctl(ov, 0.99):.3f} ms",
                      flush=True)
            stop(gw)
        if redis_proc:
            stop(redis_proc)
        if args.tracing:
            plain = tmp / "plain.yaml"  # no session pinning: the plain request path
            plain.write_text(bench_policy(ups, pin=False))
            tracing_rounds(args, plain, tmp, results)

        if not args.no_litellm:
            exe = ensure_litellm()
            if exe:
                lp = free_port()
                cfg = tmp / "litellm.yaml"
                cfg.write_text(
                    "model_list:\n"
                    + "".join(
                        f"  - model_name: fake\n    litellm_params:\n      model: openai/fake\n"
                        f"      api_base: {u}\n      api_key: sk-none\n" for u in ups)
                    + "router_settings:\n  routing_strategy: simple-shuffle\n"
                    + "litellm_settings:\n  telemetry: false\n"
                )
                key = "sk-" + os.urandom(32).hex()  # LiteLLM refuses to start without a master key
                env = {"LITELLM_LOG": "ERROR", "DISABLE_SCHEMA_UPDATE": "true", "LITELLM_MASTER_KEY": key}
                ll = spawn([str(exe), "--config", str(cfg), "--port", str(lp), "--num_workers", "1"], core=1,
                           env=env, log=tmp / "litellm.log")
                wait_http(f"http://127.0.0.1:{lp}/health/liveliness", timeout=180, proc=ll)
                measure("litellm", f"http://127.0.0.1:{lp}/v1", "fake", args, results,
                        headers={"Authorization": f"Bearer {key}"}, proc=ll)
                stop(ll)
    finally:
        for p in procs:
            stop(p)

    d = results["direct"]
    print("\nadded over a direct call (p50 / p99 at c=1, streaming TTFB p50), throughput at c=32 on one core:")
    for name, r in results.items():
        if name == "direct":
            continue
        print(f"  {name:>18}: +{r['p50'] - d['p50']:.3f} ms / +{r['p99'] - d['p99']:.3f} ms, "
              f"TTFB +{r['ttfb_p50'] - d['ttfb_p50']:.3f} ms, {r['rps']:.0f} req/s, "
              f"{r.get('rps_per_cpu_second', float('nan')):.0f} req per CPU-second")
    sy = results.get("switchyard")
    for peer in ("bare forwarder", "litellm"):
        if sy and peer in results:
            p = results[peer]
            add_sy = max(sy["p50"] - d["p50"], 1e-6)
            add_p = p["p50"] - d["p50"]
            print(f"  {peer} adds {add_p / add_sy:.1f}x the p50 latency switchyard adds; switchyard serves "
                  f"{sy['rps'] / p['rps']:.2f}x its requests/s and "
                  f"{sy['rps_per_cpu_second'] / p['rps_per_cpu_second']:.2f}x its requests per CPU-second")
    for with_redis, base, what in (("switchyard+redis", "switchyard", "no session"),
                                   ("sy+redis+session", "switchyard+session", "with a session id")):
        if with_redis in results and base in results:
            r, b = results[with_redis], results[base]
            print(f"  shared state in Redis ({what}) adds p50 {r['p50'] - b['p50']:+.3f} ms, "
                  f"p99 {r['p99'] - b['p99']:+.3f} ms, TTFB p50 {r['ttfb_p50'] - b['ttfb_p50']:+.3f} ms, "
                  f"throughput {r['rps'] / b['rps']:.2f}x (target: p50 <= +0.3 ms at c=1); "
                  f"the gateway's own overhead header: p50 {r['overhead_hdr_p50'] - b['overhead_hdr_p50']:+.3f} ms, "
                  f"p99 {r['overhead_hdr_p99'] - b['overhead_hdr_p99']:+.3f} ms")
    off, on = results.get("switchyard, tracing off"), results.get("switchyard, tracing on")
    before = results.get("switchyard, before")
    if off and before:
        print(f"  tracing off vs the tree before (medians of {args.rounds} rounds): p50 {off['p50'] - before['p50']:+.3f} ms, "
              f"p99 {off['p99'] - before['p99']:+.3f} ms, TTFB p50 {off['ttfb_p50'] - before['ttfb_p50']:+.3f} ms, "
              f"throughput {off['rps'] / before['rps']:.2f}x, req per CPU-second "
              f"{off['rps_per_cpu_second'] / before['rps_per_cpu_second']:.2f}x")
    if off and on:
        print(f"  tracing on vs off (medians of {args.rounds} alternating rounds): p50 {on['p50'] - off['p50']:+.3f} ms, "
              f"p99 {on['p99'] - off['p99']:+.3f} ms, TTFB p50 {on['ttfb_p50'] - off['ttfb_p50']:+.3f} ms, "
              f"throughput {on['rps'] / off['rps']:.2f}x, req per CPU-second "
              f"{on['rps_per_cpu_second'] / off['rps_per_cpu_second']:.2f}x; the gateway's own overhead header: "
              f"p50 {on['overhead_hdr_p50'] - off['overhead_hdr_p50']:+.3f} ms (goal: p50 <= +0.3 ms)")
    write_results(args.out, results)


if __name__ == "__main__":
    main()
