"""The three proxy endpoints: POST /v1/chat/completions, /v1/completions and /v1/route.

One pass per request: parse once (orjson), validate the little we need, route, send, relay.
Only `model` is rewritten; every other field goes upstream untouched. They are answered by a
pure ASGI middleware in front of FastAPI (no router, no dependency injection): it measured
~2x the requests/s of the same handlers as routes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from switchyard import errors
from switchyard.api import errors as http_errors
from switchyard.api.openai import decision_headers
from switchyard.api.relay import StreamRelay
from switchyard.classify.features import extract
from switchyard.gateway.gateway import LoadedPolicy, Target
from switchyard.gateway.keys import KeyRecord
from switchyard.gateway.requests import kind_of, validate
from switchyard.gateway.routing import Routed, session_id_of
from switchyard.gateway.runtime import Runtime
from switchyard.gateway.usage import UsageTap, parse_usage
from switchyard.policy.rules import RouteDecision
from switchyard.policy.schema import PriceSpec
from switchyard.pools.dispatch import Answer, AttemptTrace, ForwardedTraceContext

if TYPE_CHECKING:  # imported by api/app.py only when tracing is on
    from switchyard.gateway.tracing import RequestTrace

JSON = "application/json"
MAX_JSON_DEPTH = 200  # orjson encodes at most 254 levels


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (iterative: no recursion limit)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d)
        stack.extend((x, d + 1) for x in v if isinstance(x, dict | list))
    return deepest


def parse_json(raw: bytes) -> Any:
    """A request body as JSON, for every route that reads one (the proxy's and the UI's): a 400
    for what does not parse, and for what nests deeper than MAX_JSON_DEPTH."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise errors.BadRequest(f"could not parse the JSON body: {e}") from None
    # Deeper than the encoder takes, the body could not be sent upstream or answered (a 500 on
    # re-encoding): refuse it now. A body with fewer brackets than the limit cannot be that deep,
    # so most never get walked.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and json_depth(body) > MAX_JSON_DEPTH:
        raise errors.BadRequest(f"the JSON body is nested deeper than {MAX_JSON_DEPTH} levels")
    return body


class Proxy:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def read_json(self, request: Request) -> Any:
        """The body as JSON. Its size and pace are bounded before it gets here (api/guard.py)."""
        raw = await request.body()
        if not raw:
            raise errors.BadRequest("the request body is empty; send a JSON object")
        return parse_json(raw)

    def target(self, model: str) -> Target:
        t = self.rt.gateway.resolve(model)
        if t is None:
            raise errors.NotFound(
                f"the model {model!r} does not exist here; GET /v1/models lists policies, pools and upstream models",
                "model",
            )
        return t

    async def decide(self, request: Request, kind: str, key: KeyRecord | None,
                     trace: RequestTrace | None = None) -> tuple[dict, Target, Routed]:
        body = validate(await self.read_json(request), kind)
        target = self.target(body["model"])
        sid = session_id_of(body, request.headers)
        features = extract(body, request.headers, text_cues=False)
        if trace is None:
            routed = await self.rt.gateway.route(target, features, body, sid, key.id if key else "")
        else:
            t_parsed = time.perf_counter()
            trace.mark_parsed(t_parsed)
            routed = await self.rt.gateway.route(target, features, body, sid, key.id if key else "")
            trace.mark_routed(t_parsed, time.perf_counter(), routed.decision, routed.classify_start,
                              routed.classifier_error)
        lab = routed.decision.label
        if lab.name and lab.kind not in ("session", "none"):
            self.rt.metrics.classifier_latency.labels(lab.kind).observe(lab.ms / 1000.0)
            if lab.kind == "fail-open":
                self.rt.metrics.classifier_fail_open.labels(routed.decision.policy).inc()
        return body, target, routed

    async def proxy(self, request: Request, kind: str, trace: RequestTrace | None = None) -> Response:
        rt = self.rt
        t0 = time.perf_counter()
        key = None
        try:
            if rt.auth is not None:
                key = await rt.auth.authenticate(request.headers)
            body, target, routed = await self.decide(request, kind, key, trace)
            decision = routed.decision
            if key is not None:
                assert rt.auth is not None
                rt.auth.admit(key, body["model"], decision.policy, decision.pool, decision.rule == "direct")
                if key.pools is not None and decision.fallbacks:  # no fallback into a pool the key may not use
                    decision = dataclasses.replace(
                        decision, fallbacks=tuple(p for p in decision.fallbacks if p in key.pools))
        except errors.RequestError as e:
            rt.metrics.rejected.labels(str(http_errors.status_of(e))).inc()
            if trace is not None:
                trace.failed(http_errors.status_of(e), e.message)
            return http_errors.response(e)
        lp = target.policy
        if rt.recorder is not None:
            rt.recorder.record(body, decision.session_id, routed.trace())
        stream = body.get("stream") is True
        path = "/chat/completions" if kind == "chat" else "/completions"
        headers = decision_headers(decision)
        # Tracing on: a span per attempt; off: the client's own trace context, if it sent one.
        attempts: AttemptTrace | None = trace
        if trace is not None:
            headers["x-switchyard-trace-id"] = trace.trace_id
        elif "traceparent" in request.headers:
            attempts = ForwardedTraceContext({k: request.headers[k] for k in ("traceparent", "tracestate")
                                              if k in request.headers})
        t_routed = time.perf_counter()
        # Watch for the client leaving while we wait upstream: it cancels this task, which
        # closes the upstream connection (one watcher task, no asyncio.wait, on the hot path).
        me = asyncio.current_task()
        left = []

        async def watch() -> None:
            await _client_gone(request)
            left.append(True)
            if me is not None:
                me.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            answer: Answer = await rt.gateway.dispatcher.send(lp.pools, decision, body, path, stream, attempts)
        except asyncio.CancelledError:
            if not left:
                raise
            me.uncancel()  # type: ignore[union-attr]
            rt.metrics.rejected.labels("499").inc()
            if trace is not None:
                trace.failed(499, "the client left before the upstream answered")
            return Response(status_code=499)
        except errors.RequestError as e:
            dt = time.perf_counter() - t0
            status = http_errors.status_of(e)
            rt.finished(decision, decision.pool, "-", status, dt, dt)
            if trace is not None:
                trace.failed(status, e.message)
            return http_errors.response(e, headers)
        finally:
            watcher.cancel()
        try:
            return await self._respond(answer, decision, lp, headers, t0, t_routed, key, request, trace)
        except BaseException:
            if answer.stream is not None:  # never leak a replica slot or an open upstream stream
                answer.finish("client_gone", "", rt.gateway.state)
            raise

    async def _respond(self, answer: Answer, decision: RouteDecision, lp: LoadedPolicy, headers: dict[str, str],
                       t0: float, t_routed: float, key: KeyRecord | None, request: Request,
                       trace: RequestTrace | None) -> Response:
        rt = self.rt
        if trace is not None:
            trace.mark_relay(answer.t_first)
        auth = rt.auth if key is not None else None
        if answer.pool != decision.pool:
            headers["x-switchyard-pool"] = answer.pool
            headers["x-switchyard-fallback-from"] = decision.pool
        headers["x-switchyard-replica"] = answer.replica.name
        if answer.attempts > 1:
            headers["x-switchyard-attempts"] = str(answer.attempts)
        if decision.session_id:
            await rt.gateway.remember_replica(decision, lp, answer.replica.url, key.id if key else "")
            await rt.gateway.state.flush()  # the next turn may come through another gateway
        price = lp.pools[answer.pool].spec.price if answer.pool in lp.pools else None
        if answer.stream is None:
            usage = parse_usage(answer.body) if answer.status < 400 else None
            cost = None
            if usage is not None and price is not None:
                cost = price.cost(usage.prompt, usage.completion, usage.cached)
                headers["x-switchyard-cost-usd"] = f"{cost:.9f}"
            now = time.perf_counter()
            overhead = (answer.t_sent - t_routed) + (t_routed - t0) + (now - answer.t_first)
            headers["x-switchyard-overhead-ms"] = f"{overhead * 1000:.3f}"
            rt.finished(decision, answer.pool, answer.replica.name, answer.status, now - t0, overhead, usage, cost)
            if trace is not None:
                trace.answered(answer.pool, answer.replica.name, answer.status, answer.attempts, usage, cost)
            if auth is not None and key is not None and answer.status < 400:
                if usage is None:
                    auth.account(key, _prompt_estimate(request), True)
                else:
                    auth.account(key, usage.total, False)
            return Response(answer.body, answer.status, headers=headers, media_type=answer.content_type)
        overhead = answer.t_sent - t0 + (time.perf_counter() - answer.t_first)
        headers["x-switchyard-overhead-ms"] = f"{overhead * 1000:.3f}"
        if price is not None:  # the cost is known only after the last byte: the prices, for the client's usage
            headers["x-switchyard-price"] = _price_header(price)
        headers["cache-control"] = "no-cache"
        headers["x-accel-buffering"] = "no"
        raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
        raw_headers.append((b"content-type", answer.content_type.encode()))
        # Tokens come from the stream's tail (its usage), without parsing events; the usage event
        # the gateway asked for on the client's behalf is taken out.
        tap = UsageTap(answer.stream, answer.usage_added)
        first = tap.feed(answer.first)

        def done(outcome: str, reason: str, sent: int) -> None:
            answer.finish(outcome, reason, rt.gateway.state)
            usage = tap.usage()
            cost = None if usage is None or price is None else price.cost(usage.prompt, usage.completion, usage.cached)
            if auth is not None and key is not None:
                if usage is None:
                    auth.account(key, tap.estimate(_prompt_estimate(request)), True)
                else:
                    auth.account(key, usage.total, False)
            code = answer.status if outcome == "ok" else (499 if outcome == "client_gone" else 502)
            rt.finished(decision, answer.pool, answer.replica.name, code, time.perf_counter() - t0, overhead,
                        usage, cost)
            if trace is not None:
                trace.answered(answer.pool, answer.replica.name, code, answer.attempts, usage, cost)

        return StreamRelay(tap, first, answer.status, raw_headers, done, answer.replica.name)

    async def route_only(self, request: Request) -> Response:
        rt = self.rt
        try:
            key = await rt.auth.authenticate(request.headers) if rt.auth is not None else None
            body = await self.read_json(request)
            if isinstance(body, dict) and "model" not in body:
                body = {**body, "model": "auto"}
            body = validate(body, kind_of(body))
            target = self.target(body["model"])
            features = extract(body, request.headers)
            # A dry run: it reads the session's state but never writes it.
            routed = await rt.gateway.route(target, features, body, session_id_of(body, request.headers),
                                            key.id if key else "", commit=False)
            if key is not None and rt.auth is not None:
                d = routed.decision
                rt.auth.check(key, body["model"], d.policy, d.pool, d.rule == "direct")
        except errors.RequestError as e:
            return http_errors.response(e)
        lp = target.policy
        out = routed.trace()
        pool = lp.pools[routed.decision.pool]
        out["upstream_model"] = pool.model
        out["replicas"] = [r.snapshot() for r in pool.replicas]
        out["features"] = features.summary()
        return Response(orjson.dumps(out), 200, headers=decision_headers(routed.decision), media_type=JSON)

    def models(self) -> Response:
        data = []
        created = int(self.rt.started)
        for name, t in self.rt.gateway.model_names():
            if t.pool is None:
                meta = {"kind": "policy", "policy": t.policy.name}
            elif name == t.pool:
                meta = {"kind": "pool", "policy": t.policy.name, "pool": t.pool}
            else:
                meta = {"kind": "upstream", "policy": t.policy.name, "pool": t.pool}
            data.append({"id": name, "object": "model", "created": created, "owned_by": "switchyard",
                         "switchyard": meta})
        return Response(orjson.dumps({"object": "list", "data": data}), media_type=JSON)


class FastPath:
    """Pure ASGI middleware: POST /v1/chat/completions, /v1/completions and /v1/route."""

    def __init__(self, app: ASGIApp, proxy: Proxy):
        self.app = app
        self.rt = proxy.rt
        self.routes = {
            "/v1/chat/completions": lambda r, t: proxy.proxy(r, "chat", t),
            "/v1/completions": lambda r, t: proxy.proxy(r, "completions", t),
            "/v1/route": lambda r, t: proxy.route_only(r),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            handler = self.routes.get(scope["path"])
            if handler is not None:
                if scope["method"] != "POST":
                    resp = http_errors.response(errors.MethodNotAllowed(f"{scope['method']} {scope['path']}: use POST"))
                    await resp(scope, receive, send)
                    return
                rt = self.rt
                rt.active += 1
                rt.admitted += 1
                request = Request(scope, receive)
                trace = None
                if rt.tracer is not None and scope["path"] != "/v1/route":
                    trace = rt.tracer.begin(scope["method"], scope["path"], request.headers)
                try:
                    resp = await handler(request, trace)
                    await resp(scope, receive, send)
                finally:
                    rt.active -= 1
                    if trace is not None:
                        trace.end()
                return
        await self.app(scope, receive, send)


def _price_header(p: PriceSpec) -> str:
    cached = p.prompt if p.cached is None else p.cached
    return f"prompt={p.prompt:g}; completion={p.completion:g}; cached={cached:g}; unit=USD per 1M tokens"


def _prompt_estimate(request: Request) -> int:
    """Prompt tokens when the upstream reports no usage: about 4 bytes of request body per token."""
    try:
        return int(request.headers.get("content-length") or 0) // 4
    except ValueError:
        return 0


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return
