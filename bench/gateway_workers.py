"""requests/s of `switchyard serve --workers N` (N = 1, 2, ...) against a stub upstream, rounds
alternating, and a py-spy profile of the single worker at c=32.

    python bench/gateway_workers.py                      # workers 1 and 2, 3 rounds of 8 s each
    python bench/gateway_workers.py --workers 1 2 4 --rounds 5
    python bench/gateway_workers.py --profile 10         # also: py-spy on one worker at c=32, top self frames
    python bench/gateway_workers.py --workers 1 2 4 --loader python   # no wrk: Python load processes

On a host without wrk the load comes from Python processes (stdlib asyncio, uvloop when installed);
with enough cores (>= 2 x the largest --workers + 3) the gateway's workers, the stub upstream and
the loader are pinned to cores of their own (taskset), and the figures are written as JSON (--out).

The stub upstream is a raw asyncio protocol (uvloop) answering every POST with one fixed chat
completion, so that it costs little next to the gateway: on a small machine a Python upstream
would be the bottleneck before the workers are. wrk drives 32 connections (new ones spread over
the workers by the kernel, SO_REUSEPORT). Nothing is pinned to a core: N workers need N cores,
so the load generator and the stub share the machine with them; the figure of merit is the
ratio of N workers to one, on a machine with cores to spare (>= N + 2).
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
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gateway_overhead import free_port, wait_http  # noqa: E402

BODY = {"model": "auto", "messages": [{"role": "user", "content": "What is the weather in Paris today?"}],
        "max_tokens": 16}

ANSWER = json.dumps({
    "id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "fake",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Sunny, 21 C."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}).encode()

STUB = r'''
import asyncio, sys
ANSWER = sys.argv[2].encode()
RESP = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(ANSWER)) + ANSWER
MODELS = b'{"object":"list","data":[{"id":"fake","object":"model"}]}'
GET = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(MODELS)) + MODELS

class Stub(asyncio.Protocol):
    """Keep-alive HTTP/1.1: a request is its headers plus content-length bytes; one answer each."""
    def connection_made(self, t):
        self.t, self.buf = t, b""
    def data_received(self, data):
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            n = 0
            i = head.find(b"content-length:")
            if i >= 0:
                n = int(head[i + 15:].split(b"\r\n", 1)[0])
            if len(self.buf) < end + 4 + n:
                return
            self.buf = self.buf[end + 4 + n:]
            self.t.write(RESP if head.startswith(b"post") else GET)

async def main():
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(Stub, "127.0.0.1", int(sys.argv[1]), backlog=1024, reuse_port=True)
    await srv.serve_forever()
try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
'''


def wait_workers(url: str, n: int, timeout: float = 60.0) -> None:
    """Every worker listening: /health's worker block from n distinct pids (fresh connections)."""
    import urllib.request

    if n == 1:
        return
    seen: set[int] = set()
    deadline = time.time() + timeout
    while len(seen) < n:
        if time.time() > deadline:
            raise RuntimeError(f"only {len(seen)} of {n} workers answered")
        req = urllib.request.Request(url + "/health", headers={"Authorization": "Bearer bench-admin"})
        with urllib.request.urlopen(req, timeout=2) as r:
            seen.add(json.loads(r.read())["worker"]["pid"])


# A load generator for hosts without wrk: stdlib only (asyncio; uvloop when installed), keep-alive
# HTTP/1.1 POSTs, `procs` processes of conns/procs connections each, every answer's status and
# Content-Length read (a chunked or close-delimited answer counts as an error). One process does
# ~10-20k req/s on one core: give it as many cores as the gateway's workers need.
PYLOAD = r"""
import asyncio, json, sys, time
host, port, path, conns, seconds, body = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6].encode()
REQ = b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    path.encode(), host.encode(), port, len(body), body)
ok = bad = 0
lat = []
async def one(deadline):
    global ok, bad
    r, w = await asyncio.open_connection(host, port)
    loop = asyncio.get_running_loop()
    try:
        while loop.time() < deadline:
            t = time.perf_counter()
            w.write(REQ)
            head = await r.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            i = head.lower().find(b"content-length:")
            if i < 0:
                bad += 1
                return
            n = int(head[i + 15:head.index(b"\r\n", i)])
            await r.readexactly(n)
            lat.append(time.perf_counter() - t)
            if 200 <= status < 300:
                ok += 1
            else:
                bad += 1
    except (OSError, asyncio.IncompleteReadError):
        bad += 1
    finally:
        w.close()
async def main():
    deadline = asyncio.get_running_loop().time() + seconds
    t0 = time.perf_counter()
    await asyncio.gather(*(one(deadline) for _ in range(conns)))
    lat.sort()
    print(json.dumps({"ok": ok, "bad": bad, "seconds": time.perf_counter() - t0,
                      "p50_ms": lat[len(lat) // 2] * 1000 if lat else None,
                      "p99_ms": lat[int(len(lat) * 0.99)] * 1000 if lat else None}))
try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""


def py_rps(url: str, conns: int, seconds: int, procs: int, cores: str | None) -> tuple[float, int]:
    """requests/s of `procs` Python load processes (PYLOAD) sharing `conns` connections."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    per = [conns // procs + (1 if i < conns % procs else 0) for i in range(procs)]
    ps = [subprocess.Popen(_pin(cores) + [sys.executable, "-c", PYLOAD, u.hostname or "127.0.0.1", str(u.port),
                                          u.path, str(n), str(seconds), json.dumps(BODY)],
                           stdout=subprocess.PIPE, text=True) for n in per if n]
    ok = bad = 0
    wall = 0.0
    for p in ps:
        out, _ = p.communicate(timeout=seconds + 60)
        r = json.loads(out.strip().splitlines()[-1])
        ok, bad, wall = ok + r["ok"], bad + r["bad"], max(wall, r["seconds"])
    return ok / wall if wall else float("nan"), bad


def _pin(cores: str | None) -> list[str]:
    return ["taskset", "-c", cores] if cores and shutil.which("taskset") else []


def load_rps(args: argparse.Namespace, url: str, seconds: int) -> tuple[float, int]:
    if args.loader == "wrk":
        return wrk_rps(url, args.conns, seconds, args.loader_cores)
    return py_rps(url, args.conns, seconds, args.loader_procs, args.loader_cores)


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children (a gateway's workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if d.name == str(pid) or int(f[1]) == pid:
            total += (int(f[11]) + int(f[12])) / tick
    return total


def wrk_rps(url: str, conns: int, seconds: int, cores: str | None = None) -> tuple[float, int]:
    body = json.dumps(BODY)
    script = f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\nwrk.headers["Content-Type"] = "application/json"\n'
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    out = subprocess.run(_pin(cores) + ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "-s", f.name, url],
                         capture_output=True, text=True).stdout
    os.unlink(f.name)
    rps, bad = float("nan"), 0
    for line in out.splitlines():
        if "Non-2xx" in line or "Socket errors" in line:
            bad += sum(int(x.strip(",")) for x in line.replace(":", " ").split() if x.strip(",").isdigit())
        if line.startswith("Requests/sec:"):
            rps = float(line.split()[1])
    return rps, bad


def start_gateway(policy: Path, n: int, log: Path, cores: str | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    # --no-local-redis: the workers' share of state is not what is measured here (the policy pins
    # nothing); with it each worker pays a Redis sync tick, with --redis as one gateway does.
    p = subprocess.Popen(_pin(cores) + [sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(policy), "--port", str(port),
                          "--log-level", "warning", "--no-health-checks", "--no-ui", "--no-watch",
                          "--admin-key", "bench-admin", "--workers", str(n), "--no-local-redis"],
                         stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc=p)
    wait_workers(url, n)
    return p, url


def stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def _frame(leaf: str) -> str:
    """'Proxy.proxy (switchyard/api/proxy.py:149)' -> 'Proxy.proxy (switchyard/api/proxy.py)': a function's lines summed."""
    name, _, where = leaf.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def _package(leaf: str) -> str:
    """Where a frame's code lives: switchyard's by layer (switchyard/api), others by top package."""
    where = leaf.partition(" (")[2].rsplit(":", 1)[0]
    parts = where.replace("site-packages/", "").split("/")
    if not where:
        return "(native / idle)"
    return "/".join(parts[:2]) if parts[0] == "switchyard" else parts[0].removesuffix(".py")


def self_time(collapsed: Path, top: int) -> dict[str, list[tuple[str, float]]]:
    """Top functions and packages by self time (the leaf of each sampled stack), percent of samples,
    from py-spy's raw (collapsed) output."""
    funcs: Counter[str] = Counter()
    pkgs: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        leaf = stack.rsplit(";", 1)[-1]
        funcs[_frame(leaf)] += int(n)
        pkgs[_package(leaf)] += int(n)
        total += int(n)
    return {"functions": [(f, 100.0 * k / total) for f, k in funcs.most_common(top)],
            "packages": [(f, 100.0 * k / total) for f, k in pkgs.most_common(top)]}


def profile(args: argparse.Namespace, policy: Path, tmp: Path, seconds: int) -> dict[str, list[tuple[str, float]]]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    gw, url = start_gateway(policy, 1, tmp / "gw-profile.log", args.gateway_cores.get(1))
    try:
        raw = tmp / "profile.txt"
        rec = subprocess.Popen([spy, "record", "--pid", str(gw.pid), "--duration", str(seconds), "--rate", "250",
                                "--format", "raw", "--output", str(raw), "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        load_rps(args, url + "/v1/chat/completions", seconds)
        rec.wait(seconds + 30)
        print(f"py-spy's collapsed stacks: {raw} (flamegraph.pl or speedscope.app read them)", flush=True)
        return self_time(raw, 15)
    finally:
        stop(gw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8, help="wrk duration a measurement")
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--profile", type=int, default=0, help="seconds of py-spy on one worker at c=32 (0: none)")
    ap.add_argument("--loader", choices=("auto", "wrk", "python"), default="auto",
                    help="load generator: wrk, or Python processes (stdlib; auto: wrk when installed)")
    ap.add_argument("--loader-procs", type=int, default=0, help="python loader: processes (0: as many as "
                                                                "the largest --workers, at least 2)")
    ap.add_argument("--stub-procs", type=int, default=0, help="stub upstream processes on one port, SO_REUSEPORT "
                                                              "(0: 1 + largest --workers // 4)")
    ap.add_argument("--no-pin", action="store_true", help="no taskset: on a host with >= 2 * max workers + 3 cores "
                                                          "the gateway, the stub and the loader get cores of their own")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateway_workers.json")
    args = ap.parse_args()
    if args.loader == "auto":
        args.loader = "wrk" if shutil.which("wrk") else "python"
    if args.loader == "wrk" and not shutil.which("wrk"):
        sys.exit("wrk is not installed: --loader python (or apt-get install wrk)")
    top = max(args.workers)
    args.loader_procs = args.loader_procs or max(2, top)
    args.stub_procs = args.stub_procs or 1 + top // 4
    # Cores: gateway workers first, then the stub, then the loader; pinned only where they all fit.
    ncpu = os.cpu_count() or 1
    need = top + args.stub_procs + (args.loader_procs if args.loader == "python" else 2)
    pin = not args.no_pin and ncpu >= need and shutil.which("taskset") is not None
    args.gateway_cores = {n: f"0-{n - 1}" if pin else None for n in args.workers}
    stub_cores = f"{top}-{top + args.stub_procs - 1}" if pin else None
    args.loader_cores = f"{top + args.stub_procs}-{ncpu - 1}" if pin else None
    tmp = Path(tempfile.mkdtemp(prefix="sy-workers-"))
    up_port = free_port()
    stub = tmp / "stub.py"
    stub.write_text(STUB)
    ups = [subprocess.Popen(_pin(stub_cores) + [sys.executable, str(stub), str(up_port), ANSWER.decode()])
           for _ in range(args.stub_procs)]
    up = ups[0]
    results: dict = {"cpu": _cpu(), "cores": ncpu, "load_before": os.getloadavg(), "rounds": [], "cpu_us": [],
                     "loader": args.loader, "loader_procs": args.loader_procs, "stub_procs": args.stub_procs,
                     "pinned": {"gateway": args.gateway_cores, "stub": stub_cores, "loader": args.loader_cores}
                     if pin else None}
    print(f"{ncpu} cores ({_cpu()}); loader {args.loader}"
          + (f" x{args.loader_procs}" if args.loader == "python" else "") + f"; stub x{args.stub_procs}; "
          + (f"pinned: {results['pinned']}" if pin else "not pinned"), flush=True)
    try:
        wait_http(f"http://127.0.0.1:{up_port}/v1/models", proc=up)
        policy = tmp / "bench.yaml"
        policy.write_text("version: 1\nname: bench\npools:\n  p:\n    model: fake\n    replicas:\n"
                          f"      - url: http://127.0.0.1:{up_port}/v1\nroutes:\n  - name: default\n    pool: p\n")
        stub_rps, _ = load_rps(args, f"http://127.0.0.1:{up_port}/v1/chat/completions", 3)
        results["stub_rps"] = stub_rps
        print(f"stub upstream alone: {stub_rps:.0f} req/s at c={args.conns}", flush=True)
        for r in range(args.rounds):
            row, cpu_row = {}, {}
            order = args.workers if r % 2 == 0 else args.workers[::-1]  # alternating
            for n in order:
                gw, url = start_gateway(policy, n, tmp / f"gw-{n}.log", args.gateway_cores[n])
                try:
                    load_rps(args, url + "/v1/chat/completions", 1)  # warm-up
                    c0, t0 = tree_cpu(gw.pid), time.perf_counter()
                    rps, bad = load_rps(args, url + "/v1/chat/completions", args.seconds)
                    used = tree_cpu(gw.pid) - c0
                    cpu_us = used / max(1.0, rps * (time.perf_counter() - t0)) * 1e6
                finally:
                    stop(gw)
                row[n], cpu_row[n] = rps, cpu_us
                print(f"round {r + 1}: {n} worker(s): {rps:.0f} req/s at c={args.conns}, {cpu_us:.0f} us of CPU "
                      f"a request" + (f" ({bad} errors / non-2xx)" if bad else ""), flush=True)
            results["rounds"].append(row)
            results["cpu_us"].append(cpu_row)
        med = {n: statistics.median(row[n] for row in results["rounds"]) for n in args.workers}
        results["median_rps"] = med
        results["median_cpu_us"] = {n: statistics.median(row[n] for row in results["cpu_us"]) for n in args.workers}
        base = med[args.workers[0]]
        results["scaling"] = {n: med[n] / base for n in args.workers}
        for n in args.workers:
            print(f"median: {n} worker(s) {med[n]:.0f} req/s = {med[n] / base:.2f}x, "
                  f"{results['median_cpu_us'][n]:.0f} us of CPU a request", flush=True)
        if args.profile:
            frames = profile(args, policy, tmp, args.profile)
            results["profile_top_self"] = frames
            print(f"py-spy, one worker at c={args.conns}, {args.profile} s: top frames by self time", flush=True)
            for kind in ("functions", "packages"):
                print(f" by {kind}:", flush=True)
                for frame, pct in frames[kind]:
                    print(f"  {pct:5.1f}%  {frame}", flush=True)
        results["load_after"] = os.getloadavg()
        args.out.write_text(json.dumps(results, indent=1))
        print(f"load average before {results['load_before']}, after {results['load_after']}; wrote {args.out}")
    finally:
        for u in ups:
            stop(u)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
