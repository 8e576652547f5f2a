"""requests/s of `switchyard serve --workers N` (N = 1, 2, ...) against a stub upstream, rounds
alternating, and a py-spy profile of the single worker at c=32.

    python bench/gateway_workers.py                      # workers 1 and 2, 3 rounds of 8 s each
    python bench/gateway_workers.py --workers 1 2 4 --rounds 5
    python bench/gateway_workers.py --profile 10         # also: py-spy on one worker at c=32, top self frames

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
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "auto", "messages": [{"role": "user", "content": "What is the weather in Paris today?"}],
        "max_tokens": 16}

ANSWER = json.dumps({
    "id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "fake",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Sunny, 21 C."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}).encode()

STUB = r'''
import asyncio, sys, uvloop
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
    srv = await loop.create_server(Stub, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    await srv.serve_forever()
uvloop.run(main())
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {timeout}s")


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


def wrk_rps(url: str, conns: int, seconds: int) -> tuple[float, int]:
    body = json.dumps(BODY)
    script = f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\nwrk.headers["Content-Type"] = "application/json"\n'
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "-s", f.name, url],
                         capture_output=True, text=True).stdout
    os.unlink(f.name)
    rps, bad = float("nan"), 0
    for line in out.splitlines():
        if "Non-2xx" in line or "Socket errors" in line:
            bad += sum(int(x.strip(",")) for x in line.replace(":", " ").split() if x.strip(",").isdigit())
        if line.startswith("Requests/sec:"):
            rps = float(line.split()[1])
    return rps, bad


def start_gateway(policy: Path, n: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    # --no-local-redis: the workers' share of state is not what is measured here (the policy pins
    # nothing); with it each worker pays a Redis sync tick, with --redis as one gateway does.
    p = subprocess.Popen([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(policy), "--port", str(port),
                          "--log-level", "warning", "--no-health-checks", "--no-ui", "--no-watch",
                          "--admin-key", "bench-admin", "--workers", str(n), "--no-local-redis"],
                         stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", p)
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


def profile(policy: Path, tmp: Path, seconds: int) -> dict[str, list[tuple[str, float]]]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    gw, url = start_gateway(policy, 1, tmp / "gw-profile.log")
    try:
        raw = tmp / "profile.txt"
        rec = subprocess.Popen([spy, "record", "--pid", str(gw.pid), "--duration", str(seconds), "--rate", "250",
                                "--format", "raw", "--output", str(raw), "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        wrk_rps(url + "/v1/chat/completions", 32, seconds)
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
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateway_workers.json")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is needed (apt-get install wrk)")
    tmp = Path(tempfile.mkdtemp(prefix="sy-workers-"))
    up_port = free_port()
    stub = tmp / "stub.py"
    stub.write_text(STUB)
    up = subprocess.Popen([sys.executable, str(stub), str(up_port), ANSWER.decode()])
    results: dict = {"cpu": _cpu(), "cores": os.cpu_count(), "load_before": os.getloadavg(), "rounds": []}
    try:
        wait_http(f"http://127.0.0.1:{up_port}/v1/models", up)
        policy = tmp / "bench.yaml"
        policy.write_text("version: 1\nname: bench\npools:\n  p:\n    model: fake\n    replicas:\n"
                          f"      - url: http://127.0.0.1:{up_port}/v1\nroutes:\n  - name: default\n    pool: p\n")
        stub_rps, _ = wrk_rps(f"http://127.0.0.1:{up_port}/v1/chat/completions", args.conns, 3)
        results["stub_rps"] = stub_rps
        print(f"stub upstream alone: {stub_rps:.0f} req/s at c={args.conns}", flush=True)
        for r in range(args.rounds):
            row = {}
            for n in args.workers:
                gw, url = start_gateway(policy, n, tmp / f"gw-{n}.log")
                try:
                    wrk_rps(url + "/v1/chat/completions", args.conns, 1)  # warm-up
                    rps, bad = wrk_rps(url + "/v1/chat/completions", args.conns, args.seconds)
                finally:
                    stop(gw)
                row[n] = rps
                print(f"round {r + 1}: {n} worker(s): {rps:.0f} req/s at c={args.conns}"
                      + (f" ({bad} errors / non-2xx)" if bad else ""), flush=True)
            results["rounds"].append(row)
        med = {n: statistics.median(row[n] for row in results["rounds"]) for n in args.workers}
        results["median_rps"] = med
        base = med[args.workers[0]]
        for n in args.workers:
            print(f"median: {n} worker(s) {med[n]:.0f} req/s = {med[n] / base:.2f}x", flush=True)
        if args.profile:
            top = profile(policy, tmp, args.profile)
            results["profile_top_self"] = top
            print(f"py-spy, one worker at c={args.conns}, {args.profile} s: top frames by self time", flush=True)
            for kind in ("functions", "packages"):
                print(f" by {kind}:", flush=True)
                for frame, pct in top[kind]:
                    print(f"  {pct:5.1f}%  {frame}", flush=True)
        results["load_after"] = os.getloadavg()
        args.out.write_text(json.dumps(results, indent=1))
        print(f"load average before {results['load_before']}, after {results['load_after']}; wrote {args.out}")
    finally:
        stop(up)


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
