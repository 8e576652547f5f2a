"""SSE relay per core (issue #31): chunks a second a server relays with 64 streams open, and what it
adds to each chunk's way, for a direct call, the bare forwarder and the gateway, in one run.

    python bench/stream_relay.py                           # direct, bare forwarder, this gateway
    python bench/stream_relay.py --gateway ../before .     # gateways of several source trees
    python bench/stream_relay.py --streams 64 --interval-ms 2 --seconds 8 --rounds 3

The upstream is a raw asyncio stub (uvloop): every `--interval-ms` it writes one SSE event (an OpenAI
chat.completion.chunk whose id is the monotonic time it was written, in ns) to each open stream,
one write each, so every event reaches the server under test as its own read; a stream is
`--events` events, then `data: [DONE]`. The client (raw asyncio + httptools) keeps `--streams`
streams open, starting a new one when one ends, and reads each event's age when it arrives (the
same monotonic clock across processes). Layout on a 2-core machine: stub and client on core 0, the
server under test alone on core 1. Per server: events relayed a second, the server's CPU time per
event (/proc/<pid>/stat) and so events a second per core, and the event's age p50/p99 (added: minus
the direct call's) and the p99 inter-event gap a stream saw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gateway_overhead import cpu_seconds, free_port, spawn, stop, wait_http  # noqa: E402
from sessions_soak import cpu_name  # noqa: E402

STUB = r'''
import asyncio, sys, time, uvloop
PORT, INTERVAL, EVENTS = int(sys.argv[1]), float(sys.argv[2]) / 1000, int(sys.argv[3])
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
MODELS = b'{"object":"list","data":[{"id":"fake","object":"model"}]}'
GET = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(MODELS), MODELS)
PRE = b'data: {"id":"'
POST = (b'","object":"chat.completion.chunk","created":0,"model":"fake","choices":[{"index":0,'
        b'"delta":{"content":"tok "},"finish_reason":null}]}\n\n')
DONE = b'data: [DONE]\n\n'
live = set()

def chunk(b):
    return b"%x\r\n%s\r\n" % (len(b), b)

class Stub(asyncio.Protocol):
    def connection_made(self, t):
        self.t, self.buf, self.left = t, b"", 0
    def connection_lost(self, exc):
        live.discard(self)
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
            if head.startswith(b"post"):
                self.t.write(HEAD)
                self.left = EVENTS
                live.add(self)
            else:
                self.t.write(GET)

async def tick():
    loop = asyncio.get_running_loop()
    nxt = loop.time()
    while True:
        nxt += INTERVAL
        await asyncio.sleep(max(0.0, nxt - loop.time()))
        for s in list(live):
            s.t.write(chunk(PRE + str(time.perf_counter_ns()).encode() + POST))
            s.left -= 1
            if s.left <= 0:
                s.t.write(chunk(DONE) + b"0\r\n\r\n")
                live.discard(s)

async def main():
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(Stub, "127.0.0.1", PORT, backlog=1024)
    await tick()
uvloop.run(main())
'''

BARE = r'''
import sys, aiohttp, uvicorn
from fastapi import FastAPI, Request
from starlette.responses import StreamingResponse
up = sys.argv[2]
app = FastAPI()
sess = None
@app.get("/health")
async def health():
    return {}
@app.post("/v1/chat/completions")
async def fwd(request: Request):
    global sess
    if sess is None:
        sess = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    body = await request.body()
    r = await sess.post(up + "/chat/completions", data=body, headers={"Content-Type": "application/json"})
    async def relay():
        try:
            async for b in r.content.iter_any():
                yield b
        finally:
            r.release()
    return StreamingResponse(relay(), r.status, media_type="text/event-stream")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
            log_level="warning", access_log=False)
'''


async def load(port: int, streams: int, seconds: float) -> dict:
    """`streams` streams kept open for `seconds`: events counted, their ages and gaps (ms)."""
    import httptools

    body = json.dumps({"model": "auto", "stream": True, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "Stream me something."}]}).encode()
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\n\r\n%s" % (port, len(body), body))
    loop = asyncio.get_running_loop()
    ages: list[float] = []
    gaps: list[float] = []
    stats = {"events": 0, "streams": 0, "errors": 0}
    t_end = loop.time() + seconds

    class C(asyncio.Protocol):
        def __init__(self) -> None:
            self.p = httptools.HttpResponseParser(self)
            self.buf = b""
            self.last = 0.0
            self.done: asyncio.Future = loop.create_future()

        def connection_made(self, t):  # noqa: ANN001
            self.t = t

        def data_received(self, d: bytes) -> None:
            try:
                self.p.feed_data(d)
            except Exception:
                stats["errors"] += 1
                self.t.close()

        def on_message_begin(self) -> None:
            self.last = 0.0

        def on_body(self, b: bytes) -> None:
            now = time.perf_counter_ns()
            self.buf += b
            *events, self.buf = self.buf.split(b"\n\n")
            for e in events:
                i = e.find(b'"id":"')
                if i < 0:
                    continue
                sent = int(e[i + 6:e.index(b'"', i + 6)])
                stats["events"] += 1
                ages.append((now - sent) / 1e6)
                if self.last:
                    gaps.append((now - self.last) / 1e6)
                self.last = now

        def on_message_complete(self) -> None:
            stats["streams"] += 1
            if not self.done.done():
                self.done.set_result(None)

        def connection_lost(self, exc):  # noqa: ANN001
            if not self.done.done():
                self.done.set_result(None)

    async def one() -> None:
        _, c = await loop.create_connection(C, "127.0.0.1", port)
        try:
            while loop.time() < t_end:
                c.done = loop.create_future()
                c.t.write(req)
                await c.done
                if c.t.is_closing():
                    break
        finally:
            c.t.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(streams)))
    wall = time.perf_counter() - t0
    return {**stats, "wall": wall, "ages": ages, "gaps": gaps}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", nargs="*", type=Path, default=[ROOT], help="source trees of the gateways")
    ap.add_argument("--no-bare", action="store_true")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--interval-ms", type=float, default=2.0, help="time between two events of a stream")
    ap.add_argument("--events", type=int, default=200, help="events a stream")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "stream_relay.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sy-stream-"))
    procs: list[subprocess.Popen] = []
    servers: dict[str, tuple[int, subprocess.Popen | None]] = {}
    try:
        sp = free_port()
        (tmp / "stub.py").write_text(STUB)
        procs.append(spawn([sys.executable, str(tmp / "stub.py"), str(sp), str(args.interval_ms), str(args.events)],
                           core=0, log=tmp / "stub.log"))
        time.sleep(1.0)
        up = f"http://127.0.0.1:{sp}/v1"
        servers["direct"] = (sp, None)
        if not args.no_bare:
            bp = free_port()
            (tmp / "bare.py").write_text(BARE)
            p = spawn([sys.executable, str(tmp / "bare.py"), str(bp), up], core=1, log=tmp / "bare.log")
            procs.append(p)
            servers["bare forwarder"] = (bp, p)
        policy = tmp / "policy.yaml"
        # Room for every stream at once (the default max_inflight_per_replica, 32, would queue half of 64).
        policy.write_text("version: 1\nname: bench\npools:\n  p:\n    model: fake\n    max_inflight_per_replica: 1024\n"
                          "    replicas:\n"
                          f"      - url: {up}\nroutes:\n  - name: default\n    pool: p\n")
        for tree in args.gateway:
            tree = tree.resolve()
            gp = free_port()
            p = spawn([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(policy), "--port", str(gp),
                       "--log-level", "warning", "--no-health-checks"], core=1, env={"PYTHONPATH": str(tree)},
                      cwd=tree, log=tmp / f"gw-{gp}.log")
            procs.append(p)
            servers[f"gateway {tree.name}"] = (gp, p)
        for port, p in servers.values():
            if p is not None:
                wait_http(f"http://127.0.0.1:{port}/health", proc=p)
        rows: dict[str, list[dict]] = {n: [] for n in servers}
        names = list(servers)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                port, p = servers[name]
                c0 = cpu_seconds(p.pid) if p is not None else 0.0
                res = asyncio.run(load(port, args.streams, args.seconds))
                cpu = cpu_seconds(p.pid) - c0 if p is not None else float("nan")
                row = {"events_per_s": res["events"] / res["wall"], "events": res["events"],
                       "streams": res["streams"], "errors": res["errors"],
                       "cpu_us_per_event": cpu / max(1, res["events"]) * 1e6,
                       "age_p50_ms": statistics.median(res["ages"]) if res["ages"] else float("nan"),
                       "age_p99_ms": pct(res["ages"], 0.99), "gap_p99_ms": pct(res["gaps"], 0.99)}
                row["events_per_core_s"] = 1e6 / row["cpu_us_per_event"] if p is not None else float("nan")
                rows[name].append(row)
                print(f"round {r} {name:>22}: {row['events_per_s']:7.0f} events/s  CPU {row['cpu_us_per_event']:5.1f} "
                      f"us/event ({row['events_per_core_s']:6.0f}/core-s)  age p50 {row['age_p50_ms']:.3f} p99 "
                      f"{row['age_p99_ms']:.3f} ms  gap p99 {row['gap_p99_ms']:.3f} ms  streams {row['streams']} "
                      f"errors {row['errors']}", flush=True)
    finally:
        for p in reversed(procs):
            stop(p)
    med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in rows.items()}
    d = med["direct"]
    print(f"\nmedians of {args.rounds} rounds on {cpu_name()} ({args.streams} streams, an event every "
          f"{args.interval_ms:g} ms each; server alone on core 1):")
    for n, m in med.items():
        if n == "direct":
            print(f"  {n:>22}: {m['events_per_s']:7.0f} events/s offered and read; age p50 {m['age_p50_ms']:.3f} "
                  f"p99 {m['age_p99_ms']:.3f} ms")
            continue
        m["added_age_p50_ms"] = m["age_p50_ms"] - d["age_p50_ms"]
        m["added_age_p99_ms"] = m["age_p99_ms"] - d["age_p99_ms"]
        m["added_gap_p99_ms"] = m["gap_p99_ms"] - d["gap_p99_ms"]
        print(f"  {n:>22}: {m['events_per_s']:7.0f} events/s, {m['events_per_core_s']:6.0f} per CPU-second "
              f"({m['cpu_us_per_event']:.1f} us an event); added age p50 {m['added_age_p50_ms']:+.3f} ms, p99 "
              f"{m['added_age_p99_ms']:+.3f} ms; added gap p99 {m['added_gap_p99_ms']:+.3f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cpu": cpu_name(), "args": {k: str(v) for k, v in vars(args).items()},
                                    "rounds": rows, "median": med}, indent=1))


if __name__ == "__main__":
    main()
