"""bench/hardening.py's upstream misbehaviour (issue 28): probes through a pool whose replica is
tests/bad_upstream.py, each with an oracle (what a correct gateway answers: a 502 in the API's
shape, no leaked key, no followed redirect)."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from hardening_kit import ROOT, Tally, mem_kb
from procs import Proc, free_port  # the tests' process helpers (hardening_kit puts tests/ on the path)

POOL_KEY = "sk-probe-pool-key-0123456789abcdef"
URL_SECRET = "pw-probe-secret-42"


@dataclass
class Probe:
    kind: str
    label: str
    steer: dict[str, Any]  # the bad upstream's behaviour (tests/bad_upstream.py /_control)
    check: Callable[[httpx.Response | None, dict[str, Any]], str | None]  # -> what was wrong, or None
    stream: bool = False


def _ok_502(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if r is None:
        return "the connection was dropped"
    if r.status_code < 500:
        return f"relayed as {r.status_code}, not an upstream error"
    try:
        r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return "the error is not in the API's shape"
    return None


def _no_secret(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if r is None:
        return "the connection was dropped"
    text = r.text + json.dumps(dict(r.headers))
    for s in (POOL_KEY, URL_SECRET):
        if s in text:
            return f"{s[:12]}... relayed to the client"
    return None


def _safe_type(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if r is None:
        return "the connection was dropped"
    ctype = r.headers.get("content-type", "")
    if not ctype.startswith(("application/json", "text/event-stream", "text/plain")):
        return f"relayed with Content-Type {ctype!r}"
    if r.headers.get("x-content-type-options") != "nosniff":
        return "no x-content-type-options: nosniff"
    return None


def _decoded(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if r is None:
        return "the connection was dropped"
    if r.status_code != 200:
        return f"status {r.status_code}"
    try:
        r.json()
    except ValueError:
        return "the body is not JSON (gzip bytes without their Content-Encoding)"
    return None


def _not_followed(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if ctx["stolen"]:
        return "the redirect was followed (the body re-sent to its target)"
    return _ok_502(r, ctx)


def _bounded(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if ctx["rss_raise_mb"] > 100:
        return f"gateway RSS rose {ctx['rss_raise_mb']:.0f} MB"
    return _ok_502(r, ctx)


def _stream_ends_in_error(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
    if r is None:
        return "the connection was dropped without an error event"
    if r.status_code >= 500:
        return _ok_502(r, ctx)
    body = ctx.get("stream_text", "")
    if "[DONE]" in body and "error" not in body:
        return None if ctx.get("expect_done") else "a cut stream ended as if complete"
    if '"error"' not in body:
        return "the stream ended without an error event (looks complete to the client)"
    if ctx["rss_raise_mb"] > 100:
        return f"gateway RSS rose {ctx['rss_raise_mb']:.0f} MB"
    return None


def _quick(limit_ms: float) -> Callable[[httpx.Response | None, dict[str, Any]], str | None]:
    def check(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
        if r is None:
            return "the connection was dropped"
        if ctx["ms"] > limit_ms:
            return f"took {ctx['ms']:.0f} ms"
        return None
    return check


def _all(*checks: Callable[[httpx.Response | None, dict[str, Any]], str | None]):
    def check(r: httpx.Response | None, ctx: dict[str, Any]) -> str | None:
        return next((p for c in checks if (p := c(r, ctx)) is not None), None)
    return check


JSON_H = [["Content-Type", "application/json"]]
SSE_H = [["Content-Type", "text/event-stream"]]
ANSWER = ('{{"id":"x","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant",'
          '"content":"{}"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":3,"completion_tokens":1,'
          '"total_tokens":4}}}}')


def upstream_probes() -> list[Probe]:
    probes = [Probe("upstream: redirect", f"{code} to /stolen", {
        "status": code, "headers": [["Location", "/stolen"], ["Content-Type", "application/json"]], "body": "{}"},
        _not_followed) for code in (301, 302, 307, 308)]
    probes += [
        Probe("upstream: content type", "200 text/html <script>", {
            "headers": [["Content-Type", "text/html"]], "body": "<script>alert(1)</script>"}, _safe_type),
        Probe("upstream: content type", "404 text/html", {
            "status": 404, "headers": [["Content-Type", "text/html"]], "body": "<h1>no</h1>"}, _safe_type),
        Probe("upstream: content type", "200 application/javascript", {
            "headers": [["Content-Type", "application/javascript"]], "body": "alert(1)"}, _safe_type),
        Probe("upstream: content type", "DEL byte in Content-Type", {
            "headers": [["Content-Type", "application/json\x7f"]]}, _safe_type),
        Probe("upstream: content type", "control bytes in Content-Type", {
            "headers": [["Content-Type", "application/json; x=\x01\x1b"]]}, _safe_type),
        Probe("upstream: gzip", "gzip answer", {"gzip": True}, _decoded),
        Probe("upstream: echoed key", "400 echoing Authorization", {"status": 400, "echo_auth": True}, _no_secret),
        Probe("upstream: echoed key", "422 echoing Authorization", {"status": 422, "echo_auth": True}, _no_secret),
        Probe("upstream: echoed key", "200 whose text holds the key", {
            "body": ANSWER.format("key " + POOL_KEY)}, _no_secret),
        Probe("upstream: echoed key", "stream whose text holds the key", {
            "headers": SSE_H, "body": 'data: {"choices":[{"index":0,"delta":{"content":"' + POOL_KEY
            + '"}}]}\n\ndata: [DONE]\n\n'}, _no_secret, stream=True),
        Probe("upstream: 200 error", "200 {error}", {
            "body": '{"error": {"message": "overloaded", "type": "server_error"}}'}, _ok_502),
        Probe("upstream: 200 error", "200 Anthropic-style error", {
            "body": '{"type": "error", "error": {"type": "overloaded_error", "message": "x"}}'}, _ok_502),
        Probe("upstream: 200 error", "stream whose first event is an error", {
            "headers": SSE_H, "body": 'data: {"error": {"message": "overloaded"}}\n\n'}, _ok_502, stream=True),
        Probe("upstream: huge answer", "256 MB JSON answer", {"pad_bytes": 256 << 20}, _bounded),
        Probe("upstream: endless event", "64 MB SSE event without an end", {
            "headers": SSE_H, "pad_bytes": 64 << 20}, _stream_ends_in_error, stream=True),
        Probe("upstream: cut stream", "stream without framing cut after 2 events", {
            "headers": SSE_H, "close_framing": True, "cut_at": 160,
            "body": 'data: {"choices":[{"index":0,"delta":{"content":"one"}}]}\n\n' * 4 + "data: [DONE]\n\n"},
            _stream_ends_in_error, stream=True),
        Probe("upstream: big answer, no usage", "128 KB answer without usage", {
            "body": '{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
                    '"content":"' + "{" * (128 * 1024) + '"},"finish_reason":"stop"}]}'}, _quick(2000)),
        Probe("upstream: big answer, no usage", "128 KB of nested objects, no usage", {
            "body": '{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"pad":['
                    + ",".join(['{"a":{"b":{}}}'] * 9000) + "]}"}, _quick(2000)),
    ]
    return probes


def start_bad_upstream(tmp: Path) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc([sys.executable, str(ROOT / "tests" / "bad_upstream.py"), "--port", str(port)],
                f"http://127.0.0.1:{port}/health", tmp / "bad-upstream.log")
    return proc, f"http://127.0.0.1:{port}"


def upstream_misbehaviour(t: Tally, c: httpx.Client, bad: str, policy: str) -> dict[str, Any]:
    """Each probe: steer the bad upstream, send one request to pool `bad`, judge the answer."""
    wrong: list[dict[str, Any]] = []
    by_kind: Counter = Counter()

    def steer(**cfg: Any) -> None:
        httpx.post(bad + "/_control", json=cfg, timeout=5, trust_env=False).raise_for_status()

    def bad_state() -> dict[str, Any]:
        return httpx.get(bad + "/_state", timeout=5, trust_env=False).json()

    body = {"model": "bad", "messages": [{"role": "user", "content": "hi"}]}
    for p in upstream_probes():
        steer(**p.steer)
        stolen0 = bad_state()["stolen"]
        rss0 = mem_kb(t.pid)["VmRSS"]
        ctx: dict[str, Any] = {}
        t0 = time.perf_counter()
        r: httpx.Response | None
        try:
            if p.stream:
                with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as resp:
                    chunks = []
                    for chunk in resp.iter_bytes():
                        if sum(map(len, chunks)) < 1 << 20:
                            chunks.append(chunk)
                    resp._content = b"".join(chunks)  # at most the first MB, for .text and .json()
                    r = resp
                    ctx["stream_text"] = resp._content.decode("utf-8", "replace")
            else:
                r = c.post("/v1/chat/completions", json=body, timeout=60)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            r = None
        except httpx.TimeoutException:
            r = None
            ctx["hang"] = True
        ms = (time.perf_counter() - t0) * 1000
        ctx.update(ms=ms, stolen=bad_state()["stolen"] - stolen0,
                   rss_raise_mb=(mem_kb(t.pid)["VmRSS"] - rss0) / 1024)
        problem = p.check(r, ctx)
        status: int | str = r.status_code if r is not None else ("hang" if ctx.get("hang") else "closed")
        t.add(p.kind, p.label, status, ms)
        by_kind[p.kind] += 1
        if problem is not None:
            wrong.append({"kind": p.kind, "input": p.label, "status": status, "wrong": problem})
    steer()
    # Cookies: one tenant's Set-Cookie must not ride along on the next request.
    steer(headers=[*JSON_H, ["Set-Cookie", "tenant=alice; Path=/"]])
    t0 = time.perf_counter()
    r1 = c.post("/v1/chat/completions", json=body, headers={"x-session-id": "alice"})
    steer()
    c.post("/v1/chat/completions", json=body, headers={"x-session-id": "bob"})
    t.add("upstream: cookie", "Set-Cookie then another tenant", r1.status_code, (time.perf_counter() - t0) * 1000)
    if "cookie" in bad_state()["last_headers"]:
        wrong.append({"kind": "upstream: cookie", "input": "Set-Cookie then another tenant", "status": r1.status_code,
                      "wrong": "the upstream's cookie was sent with another tenant's request"})
    # Credentials of the replica URL and the pool key, wherever the gateway shows replicas.
    creds = {**body, "model": "creds"}
    r1 = c.post("/v1/chat/completions", json=creds)
    steer(status=503, body='{"error": {"message": "down"}}')
    r2 = c.post("/v1/chat/completions", json=creds)
    steer()
    for label, resp in (("x-switchyard-* headers", r1), ("an upstream failure's message", r2),
                        ("/v1/route", c.post("/v1/route", json=creds)),
                        ("/health", c.get("/health")), ("/metrics", c.get("/metrics")),
                        ("/ui/api/policies", c.get("/ui/api/policies"))):
        t.add("upstream: credentials shown", label, resp.status_code, 0.0)
        problem = _no_secret(resp, {})
        if problem is None and "agent:" in resp.text + json.dumps(dict(resp.headers)) and label != "/ui/api/policies":
            problem = "the URL's user name is shown"
        if problem is not None:
            wrong.append({"kind": "upstream: credentials shown", "input": label, "status": resp.status_code,
                          "wrong": problem})
    # Policy edits: a ${NAME} nobody allowed, and 200k YAML nodes, through the UI's apply.
    env_text = policy.replace("    model: m\n", "    model: m\n    api_key: '${HOME}'\n", 1)
    t0 = time.perf_counter()
    r = c.post("/ui/api/policies/apply", json={"name": "p", "text": env_text}, timeout=30)
    t.add("UI: ${ENV}", "apply with api_key ${HOME}", r.status_code, (time.perf_counter() - t0) * 1000)
    if r.status_code == 200:
        wrong.append({"kind": "UI: ${ENV}", "input": "apply with api_key ${HOME}", "status": 200,
                      "wrong": "applied: the gateway's $HOME would go to the pool's upstream"})
        c.post("/ui/api/policies/apply", json={"name": "p", "text": policy}, timeout=30)
    flat = "version: 1\nx: [" + ",".join("1" for _ in range(200_000)) + "]\n"
    t0 = time.perf_counter()
    r = c.post("/ui/api/policies/apply", json={"name": "p", "text": flat}, timeout=60)
    ms = (time.perf_counter() - t0) * 1000
    t.add("UI: apply", "200,000 YAML nodes", r.status_code, ms)
    if ms > 5000:
        wrong.append({"kind": "UI: apply", "input": "200,000 YAML nodes", "status": r.status_code,
                      "wrong": f"took {ms / 1000:.1f} s"})
    return {"tried": sum(by_kind.values()) + 9, "wrong": wrong}  # + cookie, 6 places, 2 UI edits


