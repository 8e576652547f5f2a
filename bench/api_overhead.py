"""What translation costs: the gateway's added latency and CPU per request for a Responses and a
Messages request against a Chat Completions request of the same content, in one run.

    python bench/api_overhead.py [--n 400] [--rounds 3] [--out bench/results/api_overhead.json]

One stub upstream (tests/fake_upstream.py, chat only) and the client on core 0, the gateway alone
on core 1. Each round sends N sequential requests per API (keep-alive, aiohttp), the APIs
interleaved round by round (their order reversed every other round) so that drift hits them
alike, plus N straight to the upstream (chat).
Added latency = p50 through the gateway - p50 direct; "own" = the median of the gateway's own
x-switchyard-overhead-ms (its time outside the upstream wait, rendering and storing included),
which a busy machine's scheduling disturbs less. CPU per request: the gateway process's user +
system time over the batch / N. Streaming: time to the first bytes of the answer (the upstream's
first chunk direct; the client's first event through the gateway: for Responses that is
response.created, sent when the upstream's first chunk arrives), gateway minus direct.
Figures are medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import free_port, spawn, stop, wait_http  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT = "What is the weather in Paris today? Answer in one short sentence."
BODIES = {
    "chat": ("/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": TEXT}],
                                      "max_tokens": 16}),
    "responses": ("/v1/responses", {"model": "auto", "input": TEXT, "max_output_tokens": 16}),
    "responses (store: false)": ("/v1/responses", {"model": "auto", "input": TEXT, "max_output_tokens": 16,
                                                   "store": False}),
    "messages": ("/v1/messages", {"model": "auto", "max_tokens": 16, "messages": [{"role": "user", "content": TEXT}]}),
}
POLICY = """
version: 1
name: bench
pools:
  p:
    model: m
    max_inflight_per_replica: 64
    health: {{interval: 0}}
    replicas: [{{url: '{up}/v1'}}]
routes: [{{name: default, pool: p}}]
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def batch(s: aiohttp.ClientSession, url: str, body: dict, n: int, stream: bool,
                own: list[float] | None = None) -> list[float]:
    """Client-side seconds per request (to the first bytes when streaming); `own` collects the
    gateway's own x-switchyard-overhead-ms (its time outside the upstream wait)."""
    payload = json.dumps({**body, "stream": True} if stream else body).encode()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        async with s.post(url, data=payload, headers={"Content-Type": "application/json"}) as r:
            if stream:
                await r.content.readany()
                out.append(time.perf_counter() - t0)
                await r.read()
            else:
                await r.read()
                out.append(time.perf_counter() - t0)
            assert r.status == 200, (url, r.status)
            if own is not None:
                own.append(float(r.headers["x-switchyard-overhead-ms"]))
    return out


async def run(gw: str, up: str, pid: int, n: int, rounds: int) -> dict:
    per: dict[str, dict[str, list[float]]] = {k: {"p50": [], "p99": [], "cpu": [], "ttfb": [], "own": []}
                                             for k in BODIES}
    direct: dict[str, list[float]] = {"p50": [], "p99": [], "ttfb": []}
    conn = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=conn) as s:
        for path, body in BODIES.values():  # warm-up
            await batch(s, gw + path, body, 50, False)
            await batch(s, gw + path, body, 20, True)
        for r in range(rounds):
            d = await batch(s, up + "/v1/chat/completions", BODIES["chat"][1], n, False)
            direct["p50"].append(statistics.median(d))
            direct["p99"].append(statistics.quantiles(d, n=100)[98])
            direct["ttfb"].append(statistics.median(await batch(s, up + "/v1/chat/completions", BODIES["chat"][1],
                                                                n // 2, True)))
            order = list(BODIES.items())
            for name, (path, body) in (order if r % 2 == 0 else order[::-1]):  # no API always first
                c0 = cpu_seconds(pid)
                own: list[float] = []
                lat = await batch(s, gw + path, body, n, False, own)
                per[name]["own"].append(statistics.median(own))
                per[name]["cpu"].append((cpu_seconds(pid) - c0) / n)
                per[name]["p50"].append(statistics.median(lat))
                per[name]["p99"].append(statistics.quantiles(lat, n=100)[98])
                per[name]["ttfb"].append(statistics.median(await batch(s, gw + path, body, n // 2, True)))
    med = statistics.median
    out: dict = {"direct_p50_ms": med(direct["p50"]) * 1e3, "direct_ttfb_ms": med(direct["ttfb"]) * 1e3, "apis": {}}
    for name, m in per.items():
        out["apis"][name] = {
            "added_p50_ms": (med(m["p50"]) - med(direct["p50"])) * 1e3,
            "added_p99_ms": (med(m["p99"]) - med(direct["p99"])) * 1e3,
            "cpu_us_per_request": med(m["cpu"]) * 1e6,
            "own_overhead_p50_ms": med(m["own"]),
            "stream_first_event_added_ms": (med(m["ttfb"]) - med(direct["ttfb"])) * 1e3,
        }
    chat = out["apis"]["chat"]
    for a in out["apis"].values():
        a["added_p50_vs_chat"] = a["added_p50_ms"] / chat["added_p50_ms"] - 1 if chat["added_p50_ms"] > 0 else None
        a["cpu_vs_chat"] = a["cpu_us_per_request"] / chat["cpu_us_per_request"] - 1
        a["own_overhead_vs_chat"] = a["own_overhead_p50_ms"] / chat["own_overhead_p50_ms"] - 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "api_overhead.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="api-overhead-"))
    up_port, gw_port = free_port(), free_port()
    up = spawn([sys.executable, str(ROOT / "tests" / "fake_upstream.py"), "--port", str(up_port), "--name", "u",
                "--keep-alive", "60"], 0, log=tmp / "up.log")
    (tmp / "bench.yaml").write_text(POLICY.format(up=f"http://127.0.0.1:{up_port}"))
    gw = spawn([sys.executable, "-m", "switchyard.cli", "serve", "--port", str(gw_port), "--policy",
                str(tmp / "bench.yaml"), "--no-ui", "--log-level", "warning"], 1, log=tmp / "gw.log", cwd=ROOT)
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health", proc=up)
        wait_http(f"http://127.0.0.1:{gw_port}/health", proc=gw)
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {0})  # the client beside the upstream, away from the gateway
        res = asyncio.run(run(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{up_port}", gw.pid, args.n,
                              args.rounds))
    finally:
        stop(gw)
        stop(up)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
    res.update({"n": args.n, "rounds": args.rounds, "cpu": model, "python": platform.python_version(),
                "load_1m": os.getloadavg()[0]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"{'API':26} {'added p50':>10} {'vs chat':>8} {'own p50':>9} {'vs chat':>8} {'added p99':>10} "
          f"{'CPU/req':>9} {'vs chat':>8} {'stream 1st event':>17}")
    for name, a in res["apis"].items():
        vs = "" if a["added_p50_vs_chat"] is None else f"{a['added_p50_vs_chat']:+.0%}"
        print(f"{name:26} {a['added_p50_ms']:8.3f}ms {vs:>8} {a['own_overhead_p50_ms']:7.3f}ms "
              f"{a['own_overhead_vs_chat']:+8.0%} {a['added_p99_ms']:8.3f}ms "
              f"{a['cpu_us_per_request']:7.0f}us {a['cpu_vs_chat']:+8.0%} {a['stream_first_event_added_ms']:15.3f}ms")
    print(f"direct p50 {res['direct_p50_ms']:.3f} ms, direct first chunk {res['direct_ttfb_ms']:.3f} ms; {model}; "
          f"load {res['load_1m']:.1f}")


if __name__ == "__main__":
    main()
