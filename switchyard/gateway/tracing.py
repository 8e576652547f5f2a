"""OpenTelemetry traces of the gateway's requests: one span per request and one per stage.

    POST /v1/chat/completions       (server; its parent: the client's `traceparent`, if any)
      parse                         read the body, parse JSON, validate, extract features
      route                         session state, rules: policy, rule, pool, label, confidence
        classify                    the classifier's call, when one ran
      upstream                      (client) one per attempt, retries and fallbacks included:
                                    pool, replica, status or error; its `traceparent` goes upstream
      relay                         first upstream byte to the response's last byte

Imported only when tracing is on (`switchyard serve --otel`, or an OTEL_* variable naming an
exporter or an endpoint; api/cli.py decides): with it off, nothing of OpenTelemetry's SDK is loaded and
the request path pays one `is None` test per stage. Everything standard comes from the SDK and
its variables: the exporter (OTEL_TRACES_EXPORTER: otlp, console or none), OTLP's endpoint,
protocol, headers and timeout (OTEL_EXPORTER_OTLP_*), the sampler (OTEL_TRACES_SAMPLER), batch
sizes (OTEL_BSP_*), the resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) and the
propagators (OTEL_PROPAGATORS, W3C trace context by default).

The stages are recorded as they happen with perf_counter and turned into spans with explicit
times, so tracing adds no context switches and no contextvars to the hot path; only the
upstream attempts are live spans (their ids must exist when the request leaves).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from switchyard.gateway.usage import Usage
from switchyard.policy.rules import RouteDecision
from switchyard.pools.replica import Replica

log = logging.getLogger("switchyard.tracing")


def _exporter(env: Mapping[str, str]) -> tuple[SpanExporter | None, str]:
    name = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if name == "none":
        return None, "none"
    if name == "console":
        return ConsoleSpanExporter(), "console"
    if name != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: switchyard exports otlp, console or none")
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            raise ValueError("OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                             "(pip install opentelemetry-exporter-otlp-proto-grpc), or use http/protobuf") from None
        return GrpcExporter(), "otlp grpc"
    if protocol != "http/protobuf":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use http/protobuf or grpc")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(), "otlp http/protobuf"


class Tracing:
    """The gateway's tracer provider, built from the OTEL_* variables; ValueError for a setting it
    cannot honour (said at start-up, never on a request)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        exporter, self.exporter = _exporter(env)
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "switchyard"}))
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        if exporter is not None:
            self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("switchyard")
        self.service = str(resource.attributes.get("service.name"))

    def begin(self, method: str, path: str, headers: Mapping[str, str]) -> RequestTrace:
        return RequestTrace(self.tracer, method, path, headers)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"enabled": True, "exporter": self.exporter, "service": self.service}
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if self.exporter.startswith("otlp"):
            out["endpoint"] = endpoint or "default (localhost)"
        return out

    def shutdown(self) -> None:
        """Export what is left (bounded by the exporter's timeout) and stop."""
        self.provider.shutdown()


def _ns(perf: float, offset: int) -> int:
    return int(perf * 1e9) + offset


class AttemptSpan:
    """One upstream attempt (pools/dispatch.AttemptSpan): a live client span whose context goes
    upstream as `traceparent`."""

    __slots__ = ("span", "headers")

    def __init__(self, span: trace.Span, headers: dict[str, str]):
        self.span = span
        self.headers = headers

    def end(self, status: int | None, error: str) -> None:
        if status is not None:
            self.span.set_attribute("http.response.status_code", status)
        if error:
            self.span.set_status(Status(StatusCode.ERROR, error))
        self.span.end()


class RequestTrace:
    """One request's spans. Stages are marked with perf_counter times and become spans at the
    end; `attempt` opens a live span per upstream attempt."""

    def __init__(self, tracer: trace.Tracer, method: str, path: str, headers: Mapping[str, str]):
        self.tracer = tracer
        self.offset = time.time_ns() - time.perf_counter_ns()  # perf_counter -> epoch ns
        self.t0 = time.perf_counter()
        parent = propagate.extract(headers)
        self.span = tracer.start_span(f"{method} {path}", context=parent, kind=SpanKind.SERVER,
                                      start_time=_ns(self.t0, self.offset),
                                      attributes={"http.request.method": method, "url.path": path})
        self.ctx = trace.set_span_in_context(self.span)
        self.recording = self.span.is_recording()  # False: not sampled; only the context goes upstream
        self.parsed: float | None = None
        self.routed: tuple[float, float] | None = None
        self.classified: tuple[float, float] | None = None
        self.relay_from: float | None = None
        self.route_attrs: dict[str, Any] = {}
        self.classify_attrs: dict[str, Any] = {}

    @property
    def trace_id(self) -> str:
        return format(self.span.get_span_context().trace_id, "032x")

    # --- what the proxy reports as it goes ---------------------------------------------------

    def mark_parsed(self, at: float) -> None:
        if self.recording:
            self.parsed = at

    def mark_routed(self, start: float, end: float, decision: RouteDecision, classify_start: float,
                    classifier_error: str | None) -> None:
        if not self.recording:
            return
        self.routed = (start, end)
        lab = decision.label
        attrs: dict[str, Any] = {"switchyard.policy": decision.policy, "switchyard.rule": decision.rule,
                                 "switchyard.pool": decision.pool, "switchyard.reason": decision.reason,
                                 "switchyard.label": lab.name or "none"}
        if lab.name:
            attrs["switchyard.confidence"] = round(lab.confidence, 4)
            attrs["switchyard.classifier"] = lab.kind
        if decision.fallbacks:
            attrs["switchyard.fallbacks"] = list(decision.fallbacks)
        self.route_attrs = attrs
        self.span.set_attributes(attrs)
        if classify_start:  # a classifier ran (not a label the session kept)
            self.classified = (classify_start, classify_start + lab.ms / 1000.0)
            self.classify_attrs = {"switchyard.label": lab.name, "switchyard.confidence": round(lab.confidence, 4),
                                   "switchyard.classifier": lab.kind}
            if classifier_error:
                self.classify_attrs["error.type"] = classifier_error[:200]

    def attempt(self, pool: str, replica: Replica, n: int, waited: float) -> AttemptSpan:
        span = self.tracer.start_span("upstream", context=self.ctx, kind=SpanKind.CLIENT, attributes={
            "switchyard.pool": pool, "switchyard.replica": replica.name, "switchyard.attempt": n,
            "switchyard.wait_ms": round(waited * 1000.0, 3), "server.address": replica.root,
            "http.request.method": "POST"})
        headers: dict[str, str] = {}
        propagate.inject(headers, context=trace.set_span_in_context(span))
        return AttemptSpan(span, headers)

    def mark_relay(self, first_byte: float) -> None:
        if self.recording:
            self.relay_from = first_byte

    # --- the end ---------------------------------------------------------------------------

    def answered(self, pool: str, replica: str, status: int, attempts: int, usage: Usage | None,
                 cost: float | None) -> None:
        if not self.recording:
            return
        s = self.span
        s.set_attribute("switchyard.served_by.pool", pool)
        s.set_attribute("switchyard.replica", replica)
        s.set_attribute("switchyard.attempts", attempts)
        s.set_attribute("http.response.status_code", status)
        if usage is not None:
            s.set_attribute("gen_ai.usage.input_tokens", usage.prompt)
            s.set_attribute("gen_ai.usage.output_tokens", usage.completion)
            if usage.cached:
                s.set_attribute("switchyard.usage.cached_tokens", usage.cached)
        if cost is not None:
            s.set_attribute("switchyard.cost_usd", cost)
        if status >= 500:
            s.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))

    def failed(self, status: int, message: str) -> None:
        if not self.recording:
            return
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, message[:300]))
        else:
            self.span.set_attribute("error.type", str(status))

    def end(self) -> None:
        """The response's last byte left: the stage spans, then the request's."""
        now = time.perf_counter()
        off, tr, ctx = self.offset, self.tracer, self.ctx
        if self.parsed is not None:
            tr.start_span("parse", context=ctx, start_time=_ns(self.t0, off)).end(end_time=_ns(self.parsed, off))
        if self.routed is not None:
            route = tr.start_span("route", context=ctx, start_time=_ns(self.routed[0], off),
                                  attributes=self.route_attrs)
            if self.classified is not None:
                tr.start_span("classify", context=trace.set_span_in_context(route),
                              start_time=_ns(self.classified[0], off),
                              attributes=self.classify_attrs).end(end_time=_ns(self.classified[1], off))
            route.end(end_time=_ns(self.routed[1], off))
        if self.relay_from is not None:
            tr.start_span("relay", context=ctx, start_time=_ns(self.relay_from, off)).end(end_time=_ns(now, off))
        self.span.end(end_time=_ns(now, off))
