"""OpenTelemetry traces: a gateway process exports its spans by OTLP (http/protobuf) to a real
OTLP endpoint run by the test, configured through the standard OTEL_* variables only.

Checked: the span tree of a routed request (request <- parse, route <- classify, one upstream
span per attempt with the retry, relay), its attributes, the `traceparent` each upstream got
(the attempt's own span), a client's `traceparent` as the request's parent, a stream, and that
with tracing off the SDK is never imported while the client's `traceparent` still goes upstream.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from procs import ROOT, Proc, free_port, http_get, http_post, start_gateway, start_upstream

POLICY = f"""
version: 1
name: traced
pools:
  small:
    model: small-model
    retries: 2
    price: {{{{prompt: 1, completion: 2}}}}
    health: {{{{interval: 0}}}}
    replicas: [{{{{url: "{{s0}}/v1", name: s0}}}}, {{{{url: "{{s1}}/v1", name: s1}}}}]
  large:
    model: large-model
    health: {{{{interval: 0}}}}
    replicas: [{{{{url: "{{l0}}/v1", name: l0}}}}]
classifier:
  kind: onnx
  path: {ROOT}/classifiers/tool-complexity.onnx
routes:
  - {{{{name: hard, when: {{{{text: "(?i)hard problem"}}}}, pool: large}}}}
  - {{{{name: default, pool: small}}}}
"""


@dataclass
class Collector:
    """A real OTLP/HTTP trace receiver: POST /v1/traces with ExportTraceServiceRequest bodies."""

    port: int
    spans: list[dict] = field(default_factory=list)
    service: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self) -> ThreadingHTTPServer:
        col = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                ok = self.path == "/v1/traces" and self.headers.get("content-type") == "application/x-protobuf"
                if ok:
                    req = ExportTraceServiceRequest()
                    req.ParseFromString(raw)
                    col.take(req)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 400)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    def take(self, req: ExportTraceServiceRequest) -> None:
        with self.lock:
            for rs in req.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                self.service.add(attrs.get("service.name", ""))
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        self.spans.append({
                            "name": sp.name, "trace": sp.trace_id.hex(), "id": sp.span_id.hex(),
                            "parent": sp.parent_span_id.hex(), "kind": sp.kind, "start": sp.start_time_unix_nano,
                            "end": sp.end_time_unix_nano, "status": sp.status.code,
                            "attrs": {a.key: _value(a.value) for a in sp.attributes},
                        })

    def trace(self, trace_id: str, n: int, timeout: float = 10.0) -> list[dict]:
        """The spans of one trace, once at least `n` arrived."""
        deadline = time.time() + timeout
        while True:
            with self.lock:
                got = [s for s in self.spans if s["trace"] == trace_id]
            if len(got) >= n or time.time() > deadline:
                return got
            time.sleep(0.05)


def _value(v) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Setup:
    collector: Collector
    gw: Proc
    url: str
    ups: dict[str, tuple[Proc, str]]

    def control(self, name: str, **kw) -> None:
        assert http_post(self.ups[name][1] + "/_control", orjson.dumps(kw))[0] == 200

    def upstream(self, name: str) -> dict:
        return orjson.loads(http_get(self.ups[name][1] + "/_state")[1])


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[Setup]:
    tmp: Path = tmp_path_factory.mktemp("tracing")
    col = Collector(free_port())
    srv = col.serve()
    ups = {n: start_upstream(tmp, n) for n in ("s0", "s1", "l0")}
    policy = tmp / "traced.yaml"
    policy.write_text(POLICY.format(s0=ups["s0"][1], s1=ups["s1"][1], l0=ups["l0"][1]))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{col.port}", "OTEL_SERVICE_NAME": "sy-under-test",
           "OTEL_BSP_SCHEDULE_DELAY": "100"}
    gw, url = start_gateway(tmp, [policy], env=env)
    yield Setup(col, gw, url, ups)
    gw.stop()
    for p, _ in ups.values():
        p.stop()
    srv.shutdown()


def post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url + "/v1/chat/completions", data=orjson.dumps(body),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()


def tree(spans: list[dict]) -> tuple[dict, dict[str, list[dict]]]:
    root = next(s for s in spans if s["name"] == "POST /v1/chat/completions")
    children: dict[str, list[dict]] = {}
    for s in spans:
        children.setdefault(s["parent"], []).append(s)
    for kids in children.values():
        kids.sort(key=lambda s: s["start"])
    return root, children


def test_a_routed_request_with_a_retry(setup: Setup) -> None:
    health = orjson.loads(http_get(setup.url + "/health")[1])
    assert health["tracing"]["enabled"] and health["tracing"]["exporter"] == "otlp http/protobuf"
    # A first request warms one replica up; least_inflight's tie-break (the lower latency average)
    # then sends the next one to the other replica first: it fails once, the warm one answers.
    _, h, _ = post(setup.url, {"model": "small", "messages": [{"role": "user", "content": "warm up"}]})
    warm = h["x-switchyard-replica"]
    cold = "s1" if warm == "s0" else "s0"
    setup.control(cold, fail_first=1)
    client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    client_span = "00f067aa0ba902b7"
    status, h, _ = post(setup.url, {"model": "traced", "messages": [{"role": "user", "content": "hi there"}]},
                        {"traceparent": f"00-{client_trace}-{client_span}-01"})
    assert status == 200 and h["x-switchyard-attempts"] == "2"
    assert h["x-switchyard-trace-id"] == client_trace  # the client's trace, continued
    spans = setup.collector.trace(client_trace, 7)
    root, kids = tree(spans)
    assert root["parent"] == client_span and root["kind"] == 2  # SERVER
    assert "sy-under-test" in setup.collector.service
    a = root["attrs"]
    assert a["switchyard.policy"] == "traced" and a["switchyard.pool"] == "small" and a["switchyard.rule"] == "default"
    assert a["switchyard.label"] in ("simple", "complex") and 0.0 <= a["switchyard.confidence"] <= 1.0
    assert a["switchyard.replica"] == h["x-switchyard-replica"] and a["switchyard.attempts"] == 2
    assert a["http.response.status_code"] == 200 and a["gen_ai.usage.input_tokens"] == 10
    assert a["gen_ai.usage.output_tokens"] == 5 and a["switchyard.cost_usd"] == pytest.approx(20e-6)
    names = [s["name"] for s in kids[root["id"]]]
    assert names == ["parse", "route", "upstream", "upstream", "relay"], names
    route = kids[root["id"]][1]
    (classify,) = kids[route["id"]]
    assert classify["name"] == "classify" and classify["attrs"]["switchyard.classifier"] == "onnx"
    assert route["start"] <= classify["start"] <= classify["end"] <= route["end"]
    first, second = kids[root["id"]][2:4]
    assert first["kind"] == second["kind"] == 3  # CLIENT
    assert first["attrs"]["switchyard.replica"] == cold and second["attrs"]["switchyard.replica"] == warm
    assert first["attrs"]["switchyard.attempt"] == 1 and second["attrs"]["switchyard.attempt"] == 2
    assert first["status"] == 2 and second["status"] != 2  # ERROR, then OK
    assert second["attrs"]["http.response.status_code"] == 200 and first["end"] <= second["start"]
    # Each upstream got its own attempt's span as the parent, in the client's trace.
    for sp in (first, second):
        seen = setup.upstream(sp["attrs"]["switchyard.replica"])["last_headers"]["traceparent"]
        assert seen == f"00-{client_trace}-{sp['id']}-01"
    for s in spans:  # every stage lies within the request
        assert root["start"] <= s["start"] <= s["end"] <= root["end"], s["name"]


def test_a_stream_is_traced_to_its_last_byte(setup: Setup) -> None:
    status, h, raw = post(setup.url, {"model": "traced", "stream": True,
                                      "messages": [{"role": "user", "content": "a hard problem, please"}]})
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    spans = setup.collector.trace(h["x-switchyard-trace-id"], 6)
    root, kids = tree(spans)
    assert root["parent"] == ""  # no client context: a new trace
    assert [s["name"] for s in kids[root["id"]]] == ["parse", "route", "upstream", "relay"]
    assert root["attrs"]["switchyard.pool"] == "large" and root["attrs"]["switchyard.rule"] == "hard"
    assert root["attrs"]["gen_ai.usage.output_tokens"] == 5  # from the usage the gateway asked for
    relay = kids[root["id"]][-1]
    assert relay["end"] == root["end"]
    assert setup.upstream("l0")["last_headers"]["traceparent"].split("-")[2] == kids[root["id"]][2]["id"]


def test_errors_end_the_trace_with_their_status(setup: Setup) -> None:
    req = urllib.request.Request(setup.url + "/v1/chat/completions", data=b'{"model": "nope", "messages": []}',
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code in (400, 404)
    tid = e.value.headers.get("x-switchyard-trace-id")
    assert tid is None  # refused before routing: no decision headers at all
    time.sleep(0.5)
    failed = [s for s in setup.collector.spans if s["name"] == "POST /v1/chat/completions"
              and s["attrs"].get("http.response.status_code") in (400, 404)]
    assert failed and failed[-1]["attrs"]["error.type"] in ("400", "404")


def test_tracing_off_imports_no_sdk_and_forwards_the_clients_context(tmp_path: Path) -> None:
    up, up_url = start_upstream(tmp_path, "u")
    try:
        policy = tmp_path / "p.yaml"
        policy.write_text(f"version: 1\nname: p\npools:\n  a:\n    model: m\n    health: {{interval: 0}}\n"
                          f"    replicas: [{{url: {up_url}/v1}}]\nroutes: [{{name: d, pool: a}}]\n")
        code = ("import sys; from switchyard.api.app import GatewayConfig, create_app; "
                f"app = create_app(GatewayConfig([{str(policy)!r}], watch=False, health_checks=False)); "
                "import switchyard.api.proxy; "
                "sys.exit(3 if [m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'switchyard.gateway.tracing'))] else 0)")
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        gw, url = start_gateway(tmp_path, [policy], env={"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_TRACES_EXPORTER": ""})
        try:
            assert orjson.loads(http_get(url + "/health")[1])["tracing"] == {"enabled": False}
            tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            _, h, _ = post(url, {"model": "p", "messages": [{"role": "user", "content": "hi"}]},
                           {"traceparent": tp, "tracestate": "vendor=1"})
            assert "x-switchyard-trace-id" not in h
            seen = orjson.loads(http_get(up_url + "/_state")[1])["last_headers"]
            assert seen["traceparent"] == tp and seen["tracestate"] == "vendor=1"
        finally:
            gw.stop()
    finally:
        up.stop()


def test_an_unsampled_request_records_nothing_and_still_propagates() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from switchyard.gateway.tracing import RequestTrace
    from switchyard.pools.replica import Replica

    got = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.0)))
    provider.add_span_processor(SimpleSpanProcessor(got))
    t = RequestTrace(provider.get_tracer("t"), "POST", "/v1/chat/completions", {})
    t.mark_parsed(time.perf_counter())
    span = t.attempt("p", Replica("http://h:1/v1", "r"), 1, 0.0)
    span.end(200, "")
    t.end()
    assert not t.recording and got.get_finished_spans() == ()
    version, trace_id, _, flags = span.headers["traceparent"].split("-")
    assert version == "00" and trace_id == t.trace_id and int(flags, 16) & 1 == 0  # not sampled, said so upstream
