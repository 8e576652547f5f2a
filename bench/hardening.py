"""Bad input against a real gateway, in one run: how much was tried, the slowest refusal, the
gateway's memory peak, and any 5xx of its own (there must be none).

    python bench/hardening.py                    # ~3.8k inputs, about a minute on 2 shared cores
    python bench/hardening.py --scale 0.3        # fewer of the generated ones
    python bench/hardening.py --out bench/results/hardening.json

One gateway process (open mode, loopback, short slow-client timeouts so that part stays short)
in front of the fast test upstream (tests/fake_upstream.py). The generated bodies and headers
are those of tests/gateway/test_fuzz.py (hypothesis, generate phase only, a fixed seed); the
rest are written here: deep JSON, huge and malformed headers, huge bodies, alias-bomb and
backtracking-regex policies through the UI, and slow clients (silent, trickling, unfinished
bodies, clients that stop reading a stream). Every input is sent alone (sequentially), so a
refusal's time is its own, on a machine that may be loaded: read the slowest as an upper bound.
A background probe of /health/live shows whether the event loop ever stalled.

Issue 28's kinds: work bombs (bodies of millions of empty arrays, 400k messages), and upstream
misbehaviour through a pool `bad` whose replica is tests/bad_upstream.py (a URL with credentials,
a pool key set through a YAML merge key): redirects, HTML and control bytes in Content-Type,
gzip, echoed keys, 200s that are errors, answers of 256 MB, Set-Cookie, an SSE event that never
ends, a stream cut without framing, a big answer without usage, and policy edits through the UI
(${ENV} of a variable nobody allowed, 200k YAML nodes). Each upstream probe has an oracle: what
a correct gateway does (a 502 in the API's shape, no leak, no followed redirect); the run counts
the wrong answers.

    python bench/hardening.py --tree /tmp/before --out bench/results/hardening_before.json
                                                 # the gateway of another checkout (the bench's
                                                 # own probes and upstreams from this one)

This file runs it and reports (and holds the tenant lanes); the inputs are in hardening_inputs.py,
the upstream probes in hardening_upstream.py, the tally and the senders in hardening_kit.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
from hardening_inputs import edge_bombs, generated, handmade, slow_clients, work_bombs
from hardening_kit import ROOT, SLOW_KINDS, Tally, mem_kb, refused
from hardening_upstream import POOL_KEY, URL_SECRET, start_bad_upstream, upstream_misbehaviour
from procs import (  # the tests' helpers: hardening_kit puts tests/ on the path
    Proc,
    free_port,
    start_gateway,
    start_upstream,
)


def _tokens_of(text: str, key: str) -> float:
    pre = f'switchyard_key_tokens_total{{key="{key}",'
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(pre))


def tenant_lanes(t: Tally, tmp: Path, tree: Path) -> dict[str, Any]:
    """A keyed gateway (--auth) in front of two policies that both have a pool `small` (premium
    loads first) and a streaming upstream that reports no usage (tests/edge_upstream.py): does a
    key stay in its lane (finding 4), see only what it may use (13), get counted on /v1/route and
    refused before any classifier call (10), and stay within its tpm (3)?"""
    import asyncio

    from switchyard.gateway.keys import FileKeyStore, make_key

    port = free_port()
    up = Proc([sys.executable, str(ROOT / "tests" / "edge_upstream.py"), "--port", str(port)],
              f"http://127.0.0.1:{port}/health", tmp / "edge-upstream.log")
    url = f"http://127.0.0.1:{port}"
    chunk = 'data: {"choices":[{"index":0,"delta":{"content":"w "}}]}\n\n'
    httpx.post(url + "/_control", json={"mode": "stream", "framing": "chunked", "delay_ms": 20,
                                        "events": [chunk] * 50 + ["data: [DONE]\n\n"]}, trust_env=False)
    (tmp / "a-premium.yaml").write_text(
        f"version: 1\nname: premium\npools:\n  small:\n    model: premium-small\n    replicas: [{{url: '{url}/v1'}}]\n"
        f"  large:\n    model: premium-large\n    replicas: [{{url: '{url}/v1'}}]\nroutes:\n  - {{name: d, pool: large}}\n")
    (tmp / "b-cheap.yaml").write_text(
        f"version: 1\nname: cheap\npools:\n  small:\n    model: cheap-small\n    replicas: [{{url: '{url}/v1'}}]\n"
        "routes:\n  - {name: d, pool: small}\n")
    keys_file = tmp / "keys.json"
    keys: dict[str, str] = {}

    async def put() -> None:
        store = FileKeyStore(keys_file)
        for name, pol, pools, rpm, tpm in (("cheap-small", ["cheap"], ["small"], None, None),
                                           ("rpm3", ["cheap"], None, 3, None), ("tpm1000", None, None, None, 1000),
                                           ("open", None, None, None, None)):
            keys[name], rec = make_key(name, pol, pools, rpm, tpm)
            await store.put(rec)
        await store.aclose()

    asyncio.run(put())
    admin = "sk-bench-admin"
    gw, gurl = start_gateway(tmp, [tmp / "a-premium.yaml", tmp / "b-cheap.yaml"], "--auth", "--keys-file",
                             str(keys_file), "--admin-key", admin, "--no-watch", name="gw-keyed", cwd=tree)
    wrong: list[dict[str, Any]] = []
    figures: dict[str, Any] = {}

    def h(name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[name]}"}

    def post(kind: str, label: str, path: str, body: dict, key: str, want: Callable[[httpx.Response], str | None],
             **kw: Any) -> httpx.Response:
        t0 = time.perf_counter()
        r = c.post(path, json=body, headers=h(key), **kw)
        t.add(kind, label, r.status_code, (time.perf_counter() - t0) * 1000)
        problem = want(r)
        if problem is not None:
            wrong.append({"kind": kind, "input": label, "status": r.status_code, "wrong": problem})
        return r

    msgs = [{"role": "user", "content": "hi"}]
    try:
        if time.time() % 60 > 45:  # rpm / tpm windows are whole minutes: start well inside one
            time.sleep(60 - time.time() % 60 + 0.2)
        with httpx.Client(base_url=gurl, timeout=30, trust_env=False) as c:
            post("tenant: pool across policies", "cheap/small key sends model small", "/v1/chat/completions",
                 {"model": "small", "messages": msgs}, "cheap-small",
                 lambda r: None if r.headers.get("x-switchyard-policy") == "cheap" else
                 f"served by policy {r.headers.get('x-switchyard-policy')!r}")
            for model in ("premium-small", "premium-large", "large", "premium"):
                post("tenant: pool across policies", f"cheap/small key sends model {model}", "/v1/chat/completions",
                     {"model": model, "messages": msgs}, "cheap-small",
                     lambda r: None if r.status_code == 403 else f"{r.status_code}: another policy's pool served it")
            t0 = time.perf_counter()
            listed = c.get("/v1/models", headers=h("cheap-small"))
            t.add("tenant: what a key sees", "/v1/models", listed.status_code, (time.perf_counter() - t0) * 1000)
            foreign = [m["id"] for m in listed.json().get("data", []) if m.get("switchyard", {}).get("policy") != "cheap"]
            if foreign:
                wrong.append({"kind": "tenant: what a key sees", "input": "/v1/models", "status": listed.status_code,
                              "wrong": f"lists what the key may not use: {foreign}"})
            post("tenant: what a key sees", "/v1/route", "/v1/route", {"model": "small", "messages": msgs},
                 "cheap-small", lambda r: "replica URLs, health and in-flight shown to a key"
                 if "replicas" in r.text else None)
            codes = [post("tenant: rpm", f"/v1/route #{i + 1} of 5 (rpm 3)", "/v1/route",
                          {"model": "cheap", "messages": msgs}, "rpm3", lambda r: None).status_code for i in range(5)]
            if 429 not in codes:
                wrong.append({"kind": "tenant: rpm", "input": "5 x /v1/route (rpm 3)", "status": codes,
                              "wrong": "/v1/route is not counted against the key's rpm"})

            async def streams() -> list[tuple[int, float]]:
                body = {"model": "cheap", "messages": [{"role": "user", "content": "p" * 1000}], "stream": True,
                        "max_tokens": 100}

                async def one(ac: httpx.AsyncClient) -> tuple[int, float]:
                    t0 = time.perf_counter()
                    async with ac.stream("POST", "/v1/chat/completions", json=body, headers=h("tpm1000")) as r:
                        async for _ in r.aiter_bytes():
                            pass
                        return r.status_code, (time.perf_counter() - t0) * 1000

                async with httpx.AsyncClient(base_url=gurl, timeout=60, trust_env=False) as ac:
                    return await asyncio.gather(*(one(ac) for _ in range(20)))

            admin_h = {"Authorization": f"Bearer {admin}"}
            before = _tokens_of(c.get("/metrics", headers=admin_h).text, "tpm1000")
            timed = asyncio.run(streams())
            for code, ms in timed:  # each stream's own time (20 at once on a shared machine)
                t.add("tenant: tpm", "20 concurrent streams, tpm 1000", code, ms)
            codes = [code for code, _ in timed]
            spent = _tokens_of(c.get("/metrics", headers=admin_h).text, "tpm1000") - before
            figures["tpm_1000_20_streams"] = {"served": codes.count(200), "refused_429": codes.count(429),
                                              "tokens_charged": spent}
            if spent > 2000:
                wrong.append({"kind": "tenant: tpm", "input": "20 concurrent streams, tpm 1000", "status": codes.count(200),
                              "wrong": f"{spent:.0f} tokens charged against tpm 1000"})
            raw = orjson.dumps({"model": "cheap", "messages": [{"role": "user", "content": "z" * 8000}]})
            before = _tokens_of(c.get("/metrics", headers=admin_h).text, "open")
            t0 = time.perf_counter()
            r = c.post("/v1/chat/completions", content=iter([raw[:4000], raw[4000:]]),
                       headers={**h("open"), "Content-Type": "application/json"})
            t.add("tenant: tpm", "chunked body of 2,000 prompt tokens", r.status_code,
                  (time.perf_counter() - t0) * 1000)
            charged = _tokens_of(c.get("/metrics", headers=admin_h).text, "open") - before
            figures["chunked_2000_token_prompt_charged"] = charged
            if charged < 2000:
                wrong.append({"kind": "tenant: tpm", "input": "chunked body of 2,000 prompt tokens",
                              "status": r.status_code, "wrong": f"charged {charged:.0f} tokens"})
    finally:
        gw.stop()
        up.stop()
    return {"wrong_answers": len(wrong), "wrong": wrong, **figures}


# --- the run ----------------------------------------------------------------------------------


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def git_head(tree: Path) -> str:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(tree), "log", "--oneline", "-1"], capture_output=True, text=True,
                              timeout=10).stdout.strip()[:120]
    except (OSError, subprocess.SubprocessError):
        return ""


class LiveProbe(threading.Thread):
    """GET /health/live every 50 ms: the worst answer time says whether the event loop stalled."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.worst_ms = 0.0
        self.worst_at = 0.0  # perf_counter when the worst probe was sent
        self.samples: list[float] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10, trust_env=False) as c:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = c.get(self.url + "/health/live").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.failures += not ok
                ms = (time.perf_counter() - t0) * 1000
                self.samples.append(ms)
                if ms > self.worst_ms:
                    self.worst_ms, self.worst_at = ms, t0
                self.stop.wait(0.05)


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, mem_kb(self.pid)["VmRSS"])
            except (OSError, KeyError):
                return
            self.stop.wait(0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the number of generated inputs")
    ap.add_argument("--slow", type=int, default=4, help="slow clients of each kind (half as many stop reading)")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hardening.json")
    ap.add_argument("--tree", type=Path, default=ROOT,
                    help="run the gateway of this source tree (e.g. a worktree of an older commit)")
    ap.add_argument("--label", default="", help="what the tree is, for the result file")
    args = ap.parse_args()

    import tempfile

    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="sy-hardening-"))
    up, upstream = start_upstream(tmp, "u")
    bad, bad_url = start_bad_upstream(tmp)
    bad_host = bad_url.removeprefix("http://")
    # Pool `bad`: the misbehaving upstream, its key set through a merge key; pool `creds`: the same
    # upstream behind a URL with credentials (a key and URL credentials together were a 500 before
    # issue 28, which would hide every other probe). Circuits never open: every probe reaches it.
    policy = (f"version: 1\nname: p\npools:\n  small:\n    model: m\n    replicas: [{{url: '{upstream}/v1'}}]\n"
              f"  bad:\n    <<: {{api_key: {POOL_KEY}}}\n    model: b\n    retries: 0\n"
              "    circuit: {failures: 1000000, cooldown: 1}\n    health: {interval: 3600}\n"
              f"    replicas: [{{url: '{bad_url}/v1'}}]\n"
              "  creds:\n    model: c\n    retries: 0\n    circuit: {failures: 1000000, cooldown: 1}\n"
              f"    health: {{interval: 3600}}\n    replicas: [{{url: 'http://agent:{URL_SECRET}@{bad_host}/v1'}}]\n"
              "session: {pin: pool}\nroutes:\n  - {name: canary, when: {header.x-canary: '1', text: 'a+b'}, "
              "pool: small}\n  - {name: default, pool: small}\n")
    pol = tmp / "p.yaml"
    pol.write_text(policy)
    tree = args.tree.resolve()
    gw, gurl = start_gateway(tmp, [pol], "--header-timeout", "2", "--body-timeout", "2", "--client-timeout", "2",
                             "--no-watch", cwd=tree)
    gw_module = (tree / "switchyard" / "__init__.py").exists()
    assert gw_module, f"{tree} is not a source tree of switchyard"
    port = int(gurl.rsplit(":", 1)[1])
    pid = gw.p.pid
    t = Tally(pid)
    probe, sampler = LiveProbe(gurl), RssSampler(pid)
    try:
        with httpx.Client(base_url=gurl, timeout=15, trust_env=False) as c:
            for _ in range(50):  # warm-up: the first requests pay for lazy imports and connections
                c.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user", "content": "x"}]})
            mem_start = mem_kb(pid)
            t.hwm = mem_start["VmHWM"]
            probe.start()
            sampler.start()
            t0 = time.monotonic()
            handmade(t, c, port, policy, args.scale)
            work_bombs(t, c, args.scale)
            edge_bombs(t, c)
            misbehaviour = upstream_misbehaviour(t, c, bad_url, policy)
            generated(t, c, args.scale, args.seed)
            slow = slow_clients(t, port, upstream, args.slow)
            lanes = tenant_lanes(t, tmp, tree)
            took = time.monotonic() - t0
            after = c.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user",
                                                                                        "content": "still?"}]})
            metrics = c.get("/metrics").text
        probe.stop.set()
        sampler.stop.set()
        probe.join()
        sampler.join()
        mem_end = mem_kb(pid)
        alive = gw.p.poll() is None
    finally:
        gw.stop()
        up.stop()
        bad.stop()

    outs = t.outcomes
    kinds = Counter(o.kind for o in outs)
    statuses: dict[str, Counter] = defaultdict(Counter)
    for o in outs:
        statuses[o.kind][str(o.status)] += 1
    # An upstream probe's 502/503/504 is the gateway saying the upstream failed (what it should):
    # only a 500 of the gateway's own is a gateway 5xx there.
    fives = [o for o in outs if isinstance(o.status, int) and o.status >= 500
             and not (o.kind.startswith("upstream:") and o.status in (502, 503, 504))]
    hangs = [o for o in outs if o.status in ("hang", "error")]
    fast_refusals = sorted((o for o in outs if refused(o) and o.kind not in SLOW_KINDS), key=lambda o: -o.ms)
    slow_cut = {k: {"n": len(v), "ended_after_s": [round(min(v) / 1000, 2), round(max(v) / 1000, 2)],
                    "ends": dict(Counter(str(o.status) for o in outs if o.kind == k))}
                for k in SLOW_KINDS if (v := [o.ms for o in outs if o.kind == k])}
    stalls = next((float(ln.split()[-1]) for ln in metrics.splitlines()
                   if ln.startswith("switchyard_client_stalls_total")), None)
    refusal_ms = [o.ms for o in fast_refusals]
    # The input in flight when /health/live answered slowest (the loop was stalled by it, or by
    # what the machine's other work took from the gateway's core).
    stalled_by = next((f"[{o.kind}] {o.label[:120]}" for o in outs
                       if o.t_end - o.ms / 1000 - 0.05 <= probe.worst_at <= o.t_end), "no input in flight")
    result = {
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_1m_at_start": round(os.getloadavg()[0], 2),
                    "python": platform.python_version(),
                    "note": "shared with other work (other sessions' tests and benches ran at the same time)"},
        "tree": {"path": str(tree), "label": args.label or git_head(tree)},
        "settings": {"scale": args.scale, "seed": args.seed, "slow_per_kind": args.slow,
                     "gateway": "open mode, --header-timeout 2 --body-timeout 2 --client-timeout 2"},
        "inputs_tried": len(outs),
        "by_kind": dict(kinds),
        "statuses_by_kind": {k: dict(v) for k, v in statuses.items()},
        "refusals": len(fast_refusals),
        "refusal_ms": {"p50": round(statistics.median(refusal_ms), 2) if refusal_ms else None,
                       "p99": round(sorted(refusal_ms)[int(0.99 * (len(refusal_ms) - 1))], 2) if refusal_ms else None},
        "slowest_refusals": [{"ms": round(o.ms, 1), "kind": o.kind, "input": o.label[:200], "status": o.status}
                             for o in fast_refusals[:5]],
        "slow_clients": {**slow_cut, **slow, "gateway_client_stalls_total": stalls,
                         "note": "timeouts 2 s; 'stopped reading' clients read nothing for 6 s, then drain: "
                                 "'cut' = the stream ended without its [DONE]"},
        "biggest_peak_raises": [{"kb": o.peak_raise_kb, "kind": o.kind, "input": o.label[:200]}
                                for o in sorted(outs, key=lambda o: -o.peak_raise_kb)[:5]],
        "upstream_probes": {"tried": misbehaviour["tried"], "wrong_answers": len(misbehaviour["wrong"]),
                            "wrong": misbehaviour["wrong"]},
        "tenant_lanes": lanes,
        "gateway_5xx": [{"kind": o.kind, "input": o.label[:300], "status": o.status} for o in fives],
        "hangs_or_errors": [{"kind": o.kind, "input": o.label[:300], "status": o.status} for o in hangs],
        "rss_kb": {"after_warmup": mem_start["VmRSS"], "vmhwm_after_warmup": mem_start["VmHWM"],
                   "peak_sampled": sampler.peak, "peak_vmhwm": mem_end["VmHWM"],
                   "end": mem_end["VmRSS"]},
        "health_live_worst_ms": round(probe.worst_ms, 1),
        "health_live_worst_during": stalled_by,
        "health_live_ms": {"n": len(probe.samples), "p50": round(statistics.median(probe.samples), 1),
                           "p99": round(sorted(probe.samples)[int(0.99 * (len(probe.samples) - 1))], 1),
                           "over_100": sum(1 for x in probe.samples if x > 100)} if probe.samples else None,
        "health_live_failures": probe.failures,
        "gateway_alive_after": alive and after.status_code == 200,
        "seconds": {"inputs": round(took, 1), "total": round(time.monotonic() - t_start, 1)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"bad inputs tried: {len(outs)} in {took:.0f} s")
    for k, n in kinds.most_common():
        print(f"  {n:5d}  {k:24s} {dict(statuses[k])}")
    print(f"refusals (4xx or cut, slow clients aside): {len(fast_refusals)}, p50 {result['refusal_ms']['p50']} ms, "
          f"p99 {result['refusal_ms']['p99']} ms")
    for o in fast_refusals[:3]:
        print(f"  slowest: {o.ms:7.1f} ms  {o.status}  [{o.kind}] {o.label[:100]}")
    for k, v in slow_cut.items():
        print(f"  {k}: {v['n']}, ended after {v['ended_after_s'][0]}-{v['ended_after_s'][1]} s: {v['ends']}")
    print(f"  upstream requests cancelled by stalled clients: {slow['upstream_cancelled']}, "
          f"client_stalls_total {stalls}")
    print(f"gateway RSS: {mem_start['VmRSS'] / 1024:.0f} MB after warm-up (VmHWM {mem_start['VmHWM'] / 1024:.0f} MB), peak {mem_end['VmHWM'] / 1024:.0f} MB "
          f"(VmHWM; sampled {sampler.peak / 1024:.0f} MB), {mem_end['VmRSS'] / 1024:.0f} MB at the end")
    for o in sorted(outs, key=lambda o: -o.peak_raise_kb)[:3]:
        print(f"  peak raised {o.peak_raise_kb / 1024:5.1f} MB by [{o.kind}] {o.label[:100]}")
    print(f"upstream probes: {misbehaviour['tried']} tried, {len(misbehaviour['wrong'])} answered wrongly")
    for w in misbehaviour["wrong"]:
        print(f"  wrong: [{w['kind']}] {w['input']}: {w['wrong']} (status {w['status']})")
    print(f"tenant lanes (a keyed gateway): {lanes['wrong_answers']} answered wrongly; "
          f"tpm 1000, 20 streams: {lanes.get('tpm_1000_20_streams')}; chunked 2,000-token prompt charged "
          f"{lanes.get('chunked_2000_token_prompt_charged')}")
    for w in lanes["wrong"]:
        print(f"  wrong: [{w['kind']}] {w['input']}: {w['wrong']} (status {w['status']})")
    print(f"/health/live worst {probe.worst_ms:.0f} ms ({stalled_by}), {probe.failures} failures; "
          f"{result['health_live_ms']}")
    print(f"5xx from the gateway: {len(fives)}; hangs or client errors: {len(hangs)}; alive after: "
          f"{result['gateway_alive_after']}")
    for o in (fives + hangs)[:10]:
        print(f"  {o.status} [{o.kind}] {o.label[:200]}")
    print(f"wrote {args.out}")
    sys.exit(1 if fives or hangs or not result["gateway_alive_after"] else 0)


if __name__ == "__main__":
    main()
