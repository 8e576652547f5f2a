"""Server cores and upstream clients for the proxy path, bare (no gateway logic), in one run: which
combination leaves the most room per core (issue #31's candidates, chosen by measurement).

    python bench/server_cores.py                         # every variant, 3 rounds of 6 s at c=32
    python bench/server_cores.py --variants fastapi-aiohttp rsgi-aiohttp --rounds 5
    python bench/server_cores.py --variants fastapi-aiohttp --gateway ../before . --apis responses messages

Each variant is the same forwarder (POST /v1/chat/completions: read the body, POST it upstream,
answer the upstream's bytes with its status and content type) on another server core and upstream
client. Layout on a 2-core machine: the upstream (tests/fake_upstream.py) and wrk on core 0, every
forwarder on core 1, all up at once and loaded one at a time, rounds alternating their order. Per
round: wrk's req/s at c=32 and the server's own CPU time per request (/proc/<pid>/stat: every thread
of the process, Rust runtime threads included), then N sequential requests for the p50 at c=1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gateway_overhead import client_on_core0, cpu_seconds, free_port, latency, spawn, stop, wait_http, wrk_rps  # noqa: E402
from sessions_soak import cpu_name  # noqa: E402

COMMON = '''
import asyncio, sys
port, up = int(sys.argv[1]), sys.argv[2] + "/chat/completions"
'''

AIOHTTP = '''
import aiohttp
sess = None
async def forward(body):
    global sess
    if sess is None:
        sess = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    async with sess.post(up, data=body, headers={"Content-Type": "application/json"}) as r:
        return r.status, r.headers.get("Content-Type", "application/json"), await r.read()
'''

PYREQWEST = '''
from pyreqwest.client import ClientBuilder
client = None
async def forward(body):
    global client
    if client is None:
        client = ClientBuilder().max_connections(None).build()
    r = await client.post(up).header("Content-Type", "application/json").body_bytes(body).build().send()
    return r.status, r.headers.get("content-type", "application/json"), bytes(await r.bytes())
'''

RAW = '''
import httptools
from urllib.parse import urlsplit
_u = urlsplit(up)
HOST, PORT, PATH = _u.hostname, _u.port, _u.path.encode()
idle = []
class P(asyncio.Protocol):
    def __init__(self):
        self.parser = httptools.HttpResponseParser(self)
        self.fut = None
    def connection_made(self, t):
        self.t = t
    def data_received(self, d):
        self.parser.feed_data(d)
    def on_message_begin(self):
        self.body = []; self.headers = []
    def on_header(self, k, v):
        self.headers.append((k, v))
    def on_body(self, b):
        self.body.append(b)
    def on_message_complete(self):
        f, self.fut = self.fut, None
        f.set_result((self.parser.get_status_code(), b"".join(self.body)))
    def connection_lost(self, exc):
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(ConnectionError("lost"))
HEAD = b"POST %s HTTP/1.1\\r\\nhost: %s:%d\\r\\ncontent-type: application/json\\r\\ncontent-length: " % (PATH, HOST.encode(), PORT)
async def forward(body):
    loop = asyncio.get_running_loop()
    if idle:
        p = idle.pop()
    else:
        _, p = await loop.create_connection(P, HOST, PORT)
    p.fut = loop.create_future()
    p.t.write(HEAD + str(len(body)).encode() + b"\\r\\n\\r\\n" + body)
    status, data = await p.fut
    idle.append(p)
    return status, "application/json", data
'''

FASTAPI = '''
import uvicorn
from fastapi import FastAPI, Request
from starlette.responses import Response
app = FastAPI()
@app.post("/v1/chat/completions")
async def fwd(request: Request):
    status, ctype, data = await forward(await request.body())
    return Response(data, status, media_type=ctype)
@app.get("/health")
async def health():
    return {}
uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning", access_log=False)
'''

ASGI = '''
async def read(receive):
    msg = await receive()
    body = msg.get("body", b"")
    while msg.get("more_body"):
        msg = await receive()
        body += msg.get("body", b"")
    return body
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/health":
        status, ctype, data = 200, "application/json", b"{}"
    else:
        status, ctype, data = await forward(await read(receive))
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
'''

UVICORN = '''
import uvicorn
uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
            access_log=False, lifespan="off")
'''

RSGI = '''
async def app(scope, proto):
    if scope.path == "/health":
        proto.response_bytes(200, [("content-type", "application/json")], b"{}")
        return
    status, ctype, data = await forward(await proto())
    proto.response_bytes(status, [("content-type", ctype)], data)
'''

GRANIAN = '''
import uvloop
from granian.constants import Interfaces
from granian.server.embed import Server
async def main():
    await Server(app, address="127.0.0.1", port=port, interface=Interfaces.{iface}, log_enabled=False).serve()
uvloop.run(main())
'''

VARIANTS = {
    "fastapi-aiohttp": COMMON + AIOHTTP + FASTAPI,  # the bare forwarder of bench/gateway_overhead.py
    "asgi-aiohttp": COMMON + AIOHTTP + ASGI + UVICORN,
    "asgi-pyreqwest": COMMON + PYREQWEST + ASGI + UVICORN,
    "granian-asgi-aiohttp": COMMON + AIOHTTP + ASGI + GRANIAN.replace("{iface}", "ASGI"),
    "asgi-raw": COMMON + RAW + ASGI + UVICORN,
    "rsgi-raw": COMMON + RAW + RSGI + GRANIAN.replace("{iface}", "RSGI"),
    "rsgi-aiohttp": COMMON + AIOHTTP + RSGI + GRANIAN.replace("{iface}", "RSGI"),
    "rsgi-pyreqwest": COMMON + PYREQWEST + RSGI + GRANIAN.replace("{iface}", "RSGI"),
}


TEXT = "What is the weather in Paris today?"
APIS = {  # the agent APIs through a gateway (the bare forwarders serve chat only)
    "responses": ("/v1/responses", {"model": "auto", "input": TEXT, "max_output_tokens": 16}),
    "messages": ("/v1/messages", {"model": "auto", "max_tokens": 16, "messages": [{"role": "user", "content": TEXT}]}),
}


def wrk_body(url: str, body: dict, conns: int, seconds: int) -> float:
    import shutil
    import subprocess

    script = (f'wrk.method = "POST"\nwrk.body = {json.dumps(json.dumps(body))}\n'
              'wrk.headers["Content-Type"] = "application/json"\n')
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "-s", f.name, url]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    rps = float("nan")
    for line in out.splitlines():
        if "Non-2xx" in line:
            print(f"  warning: {line.strip()} from {url}", flush=True)
        if line.startswith("Requests/sec:"):
            rps = float(line.split()[1])
    return rps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--gateway", nargs="*", type=Path, default=[], help="also `switchyard serve` of these trees")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=400, help="sequential requests a round for the p50 at c=1")
    ap.add_argument("--apis", nargs="*", default=[], choices=list(APIS),
                    help="also these APIs through each gateway (c=32 req/s and CPU a request)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "server_cores.json")
    args = ap.parse_args()
    client_on_core0()
    import importlib.util

    for lib in ("granian", "pyreqwest"):  # bench-only candidates: pip install granian pyreqwest to measure them
        if importlib.util.find_spec(lib) is None:
            left = [v for v in args.variants if lib in v or (lib == "granian" and v.startswith("rsgi"))]
            if left:
                print(f"{lib} is not installed: {', '.join(left)} left out", flush=True)
                args.variants = [v for v in args.variants if v not in left]
    tmp = Path(tempfile.mkdtemp(prefix="sy-cores-"))
    procs = []
    servers: dict[str, tuple[int, object]] = {}
    try:
        upp = free_port()
        procs.append(spawn([sys.executable, str(ROOT / "tests" / "fake_upstream.py"), "--port", str(upp),
                            "--name", "up0"], core=0))
        wait_http(f"http://127.0.0.1:{upp}/health")
        up = f"http://127.0.0.1:{upp}/v1"
        for name in args.variants:
            port = free_port()
            script = tmp / f"{name}.py"
            script.write_text(VARIANTS[name])
            p = spawn([sys.executable, str(script), str(port), up], core=1, log=tmp / f"{name}.log")
            procs.append(p)
            servers[name] = (port, p)
        policy = tmp / "policy.yaml"
        policy.write_text("version: 1\nname: bench\npools:\n  p:\n    model: fake\n    replicas:\n"
                          f"      - url: {up}\nroutes:\n  - name: default\n    pool: p\n")
        for tree in args.gateway:
            tree = tree.resolve()
            port = free_port()
            p = spawn([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(policy), "--port", str(port),
                       "--log-level", "warning"], core=1, env={"PYTHONPATH": str(tree)}, cwd=tree,
                      log=tmp / f"gw-{port}.log")
            procs.append(p)
            servers[f"gateway {tree.name}"] = (port, p)
        for port, p in servers.values():
            wait_http(f"http://127.0.0.1:{port}/health", proc=p)
        rows: dict[str, list[dict]] = {n: [] for n in servers}
        direct: list[float] = []
        names = list(servers)
        for r in range(args.rounds):
            direct.append(statistics.median(asyncio.run(latency(up + "/chat/completions", args.requests, "auto"))))
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                port, p = servers[name]
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                c0, t0 = cpu_seconds(p.pid), time.perf_counter()
                rps = wrk_rps(url, "auto", 32, args.seconds)
                wall = time.perf_counter() - t0
                cpu_us = (cpu_seconds(p.pid) - c0) / max(1.0, rps * wall) * 1e6
                lat = asyncio.run(latency(url, args.requests, "auto"))
                row = {"rps": rps, "cpu_us": cpu_us, "p50_ms": statistics.median(lat)}
                rows[name].append(row)
                if name.startswith("gateway "):
                    for api in args.apis:
                        path, body = APIS[api]
                        c0, t0 = cpu_seconds(p.pid), time.perf_counter()
                        arps = wrk_body(f"http://127.0.0.1:{port}{path}", body, 32, args.seconds)
                        acpu = (cpu_seconds(p.pid) - c0) / max(1.0, arps * (time.perf_counter() - t0)) * 1e6
                        rows.setdefault(f"{name} {api}", []).append({"rps": arps, "cpu_us": acpu, "p50_ms": float("nan")})
                        print(f"round {r} {name + ' ' + api:>22}: {arps:7.0f} req/s  CPU {acpu:5.0f} us/req", flush=True)
                print(f"round {r} {name:>22}: {rps:7.0f} req/s  CPU {cpu_us:5.0f} us/req  p50 c=1 "
                      f"{row['p50_ms']:.3f} ms", flush=True)
    finally:
        for p in reversed(procs):
            stop(p)
    out = {"cpu": cpu_name(), "args": {k: str(v) for k, v in vars(args).items()}, "rounds": rows, "median": {},
           "direct_p50_ms": statistics.median(direct), "direct_rounds": direct}
    ref = "fastapi-aiohttp" if "fastapi-aiohttp" in rows else names[0]
    print(f"\nmedians of {args.rounds} rounds on {cpu_name()} (server alone on core 1), vs {ref}; direct p50 "
          f"{out['direct_p50_ms']:.3f} ms:")
    for name, rs in rows.items():
        m = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        out["median"][name] = m
    for name, m in out["median"].items():
        b = out["median"][ref]
        m["added_p50_ms"] = m["p50_ms"] - out["direct_p50_ms"]
        print(f"  {name:>22}: {m['rps']:7.0f} req/s ({m['rps'] / b['rps']:.2f}x)  CPU {m['cpu_us']:5.0f} us/req "
              f"({b['cpu_us'] / m['cpu_us']:.2f}x per core)  p50 c=1 {m['p50_ms']:.3f} ms, added "
              f"{m['added_p50_ms']:+.3f} ms ({m['added_p50_ms'] / max(1e-6, b['p50_ms'] - out['direct_p50_ms']):.2f}x "
              f"the reference's)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
