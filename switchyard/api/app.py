"""The gateway's HTTP face: an OpenAI-compatible API on FastAPI.

One pass per request: parse once (orjson), validate the little we need, route, send,
relay. Only `model` is rewritten; every other field goes upstream untouched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from switchyard.api import errors
from switchyard.api.metrics import Metrics
from switchyard.api.openai import decision_headers, session_id_of, validate
from switchyard.api.relay import StreamRelay
from switchyard.classify.base import NO_LABEL
from switchyard.classify.features import extract
from switchyard.gateway import Gateway, LoadedPolicy, Target
from switchyard.policy.rules import RouteDecision
from switchyard.pools.dispatch import Answer, Dispatcher
from switchyard.pools.health import HealthChecker
from switchyard.state.base import StateStore
from switchyard.state.memory import MemoryStore
from switchyard.state.sync import StateSync

log = logging.getLogger("switchyard.api")

JSON = "application/json"


@dataclass
class GatewayConfig:
    policies: list[str | Path]
    max_body_bytes: int = 16 * 1024 * 1024
    watch: bool = True
    health_checks: bool = True
    record: str | None = None
    redis_url: str | None = None
    keystore: Any = None  # auth.KeyStore: API keys required when set (switchyard/auth.py)
    admin_key: str | None = None  # mounts the admin API (switchyard/api/admin.py)
    sync_interval: float = 0.05  # shared-state sync tick, seconds (with --redis)
    ui: bool = True  # the browser UI at /ui (switchyard/api/ui.py)
    reports_dir: str | None = None  # replay reports shown by the UI
    extra: dict[str, Any] = field(default_factory=dict)


class Api:
    """Request handlers; holds the gateway, the dispatcher and the metrics (no module globals)."""

    def __init__(self, config: GatewayConfig, gateway: Gateway, metrics: Metrics):
        self.config = config
        self.gateway = gateway
        self.metrics = metrics
        self.dispatcher = Dispatcher(metrics, gateway.state)
        self.recorder: Any = None
        self.started = time.time()
        self.auth: Any = None  # auth.Auth when API keys are on
        self.sync: StateSync | None = None
        self.active = 0  # requests being served (streams included): the SIGTERM drain waits on it
        self.admitted = 0
        self.draining = False
        # The UI's recent decisions: (time, decision, pool, replica, status, seconds, overhead); the page
        # reads it, the request path only appends (bounded, never waits).
        self.recent: deque[tuple] = deque(maxlen=200)

    async def read_json(self, request: Request) -> Any:
        limit = self.config.max_body_bytes
        cl = request.headers.get("content-length")
        if cl is not None:
            try:
                if int(cl) > limit:
                    raise errors.too_large(limit)
            except ValueError:
                raise errors.bad_request("invalid Content-Length header") from None
            raw = await request.body()
        else:  # chunked: count as it arrives
            parts, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise errors.too_large(limit)
                parts.append(chunk)
            raw = b"".join(parts)
        if len(raw) > limit:
            raise errors.too_large(limit)
        if not raw:
            raise errors.bad_request("the request body is empty; send a JSON object")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise errors.bad_request(f"could not parse the JSON body: {e}") from None

    def target(self, model: str) -> Target:
        t = self.gateway.resolve(model)
        if t is None:
            raise errors.not_found(
                f"the model {model!r} does not exist here; GET /v1/models lists policies, pools and upstream models",
                "model",
            )
        return t

    async def decide(self, request: Request, kind: str) -> tuple[dict, LoadedPolicy, RouteDecision]:
        body = validate(await self.read_json(request), kind)
        target = self.target(body["model"])
        sid = session_id_of(body, request.headers)
        features = extract(body, request.headers, text_cues=False)
        decision = await self.gateway.route(target, features, body, sid)
        lab = decision.label
        if lab.name and lab.kind not in ("session", "none"):
            self.metrics.classifier_latency.labels(lab.kind).observe(lab.ms / 1000.0)
            if lab.kind == "fail-open":
                self.metrics.classifier_fail_open.labels(decision.policy).inc()
        return body, target.policy, decision

    async def proxy(self, request: Request, kind: str) -> Response:
        t0 = time.perf_counter()
        key = None
        try:
            if self.auth is not None:
                key = await self.auth.authenticate(request.headers)
            body, lp, decision = await self.decide(request, kind)
            if key is not None:
                self.auth.admit(key, body["model"], decision.policy, decision.pool, decision.rule == "direct")
                if key.pools is not None and decision.fallbacks:  # no fallback into a pool the key may not use
                    decision = dataclasses.replace(
                        decision, fallbacks=tuple(p for p in decision.fallbacks if p in key.pools))
        except errors.APIError as e:
            self.metrics.rejected.labels(str(e.status)).inc()
            return e.response()
        if self.recorder is not None:
            self.recorder.record(body, decision.session_id, decision.to_dict())
        stream = body.get("stream") is True
        path = "/chat/completions" if kind == "chat" else "/completions"
        headers = decision_headers(decision)
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
            answer: Answer = await self.dispatcher.send(lp, decision, body, path, stream)
        except asyncio.CancelledError:
            if not left:
                raise
            me.uncancel()  # type: ignore[union-attr]
            self.metrics.rejected.labels("499").inc()
            return Response(status_code=499)
        except errors.APIError as e:
            dt = time.perf_counter() - t0
            self.metrics.observe(decision.policy, decision.pool, "-", decision.rule, e.status, dt, dt)
            self.recent.append((time.time(), decision, decision.pool, "-", e.status, dt, dt))
            return e.response(headers)
        finally:
            watcher.cancel()
        try:
            if key is not None:
                return await self._respond(answer, decision, lp, headers, t0, t_routed, key, request)
            return await self._respond(answer, decision, lp, headers, t0, t_routed)
        except BaseException:
            if answer.stream is not None:  # never leak a replica slot or an open upstream stream
                answer.finish("client_gone", "", self.gateway.state)
            raise

    async def _respond(self, answer: Answer, decision: RouteDecision, lp: LoadedPolicy, headers: dict[str, str],
                       t0: float, t_routed: float, key: Any = None, request: Request | None = None) -> Response:
        if answer.pool != decision.pool:
            headers["x-switchyard-pool"] = answer.pool
            headers["x-switchyard-fallback-from"] = decision.pool
        headers["x-switchyard-replica"] = answer.replica.name
        if answer.attempts > 1:
            headers["x-switchyard-attempts"] = str(answer.attempts)
        if decision.session_id:
            await self.gateway.remember_replica(decision, lp, answer.replica.url)
            await self.gateway.state.flush()  # the next turn may come through another gateway
        if answer.stream is None:
            now = time.perf_counter()
            overhead = (answer.t_sent - t_routed) + (t_routed - t0) + (now - answer.t_first)
            headers["x-switchyard-overhead-ms"] = f"{overhead * 1000:.3f}"
            self.metrics.observe(decision.policy, answer.pool, answer.replica.name, decision.rule,
                                 answer.status, now - t0, overhead)
            self.recent.append((time.time(), decision, answer.pool, answer.replica.name, answer.status,
                                now - t0, overhead))
            if key is not None and answer.status < 400:
                self.auth.account_body(key, answer.body, _prompt_estimate(request))
            return Response(answer.body, answer.status, headers=headers, media_type=answer.content_type)
        overhead = answer.t_sent - t0 + (time.perf_counter() - answer.t_first)
        headers["x-switchyard-overhead-ms"] = f"{overhead * 1000:.3f}"
        headers["cache-control"] = "no-cache"
        headers["x-accel-buffering"] = "no"
        raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
        raw_headers.append((b"content-type", answer.content_type.encode()))
        upstream: Any = answer.stream
        tap = None
        if key is not None:  # count tokens from the stream's tail (usage), without parsing events
            from switchyard.limits import StreamTap

            upstream = tap = StreamTap(answer.stream, answer.first, _prompt_estimate(request))

        def done(outcome: str, reason: str, sent: int) -> None:
            answer.finish(outcome, reason, self.gateway.state)
            if tap is not None:
                self.auth.account(key, *tap.tokens())
            code = answer.status if outcome == "ok" else (499 if outcome == "client_gone" else 502)
            dt = time.perf_counter() - t0
            self.metrics.observe(decision.policy, answer.pool, answer.replica.name, decision.rule, code, dt, overhead)
            self.recent.append((time.time(), decision, answer.pool, answer.replica.name, code, dt, overhead))

        return StreamRelay(upstream, answer.first, answer.status, raw_headers, done, answer.replica.name)

    async def route_only(self, request: Request) -> Response:
        try:
            if self.auth is not None:
                await self.auth.authenticate(request.headers)
            body = await self.read_json(request)
            kind = "completions" if isinstance(body, dict) and "prompt" in body and "messages" not in body else "chat"
            if isinstance(body, dict) and "model" not in body:
                body = {**body, "model": "auto"}
            body = validate(body, kind)
            target = self.target(body["model"])
            features = extract(body, request.headers)
            decision = await self.gateway.route(target, features, body, session_id_of(body, request.headers))
        except errors.APIError as e:
            return e.response()
        lp = target.policy
        out = decision.to_dict()
        pool = lp.pools[decision.pool]
        out["upstream_model"] = pool.model
        out["replicas"] = [r.snapshot() for r in pool.replicas]
        out["features"] = {
            "tools": features.tools, "turns": features.turns, "messages": features.messages,
            "tool_result": features.tool_result, "prompt_tokens": features.prompt_tokens,
            "model": features.model,
        }
        return Response(orjson.dumps(out), 200, headers=decision_headers(decision), media_type=JSON)

    def models(self) -> Response:
        data = []
        created = int(self.started)
        for name, t in self.gateway.model_names():
            if t.pool is None:
                meta = {"kind": "policy", "policy": t.policy.name}
            elif name == t.pool:
                meta = {"kind": "pool", "policy": t.policy.name, "pool": t.pool}
            else:
                meta = {"kind": "upstream", "policy": t.policy.name, "pool": t.pool}
            data.append({"id": name, "object": "model", "created": created, "owned_by": "switchyard",
                         "switchyard": meta})
        return Response(orjson.dumps({"object": "list", "data": data}), media_type=JSON)

    def health(self) -> dict:
        policies = {}
        degraded = False
        for lp in self.gateway.policies():
            pools = {}
            for name, pool in lp.pools.items():
                snap = pool.snapshot()
                if snap["healthy"] == 0:
                    degraded = True
                pools[name] = snap
            st = self.gateway.store.status.get(lp.name) if self.gateway.store else None
            policies[lp.name] = {
                "file": str(lp.path),
                "classifier": lp.spec.classifier.kind,
                "pools": pools,
                "last_reload": None if st is None else {"ok": st.ok, "at": st.at, "error": st.error or None},
            }
        state_ok = self.gateway.state.healthy()
        state = self.gateway.state.describe()
        if self.sync is not None and self.gateway.state.shared:
            state["sync"] = self.sync.describe()
        return {
            "status": "draining" if self.draining else ("ok" if not degraded and state_ok else "degraded"),
            "ready": not self.draining,
            "state": state,
            "auth": self.auth.describe() if self.auth is not None else {"enabled": False},
            "policies": policies,
        }


class FastPath:
    """Pure ASGI middleware: POST /v1/chat/completions, /v1/completions and /v1/route."""

    def __init__(self, app: ASGIApp, api: Api):
        self.app = app
        self.api = api
        self.routes = {
            "/v1/chat/completions": lambda r: api.proxy(r, "chat"),
            "/v1/completions": lambda r: api.proxy(r, "completions"),
            "/v1/route": api.route_only,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            handler = self.routes.get(scope["path"])
            if handler is not None:
                if scope["method"] != "POST":
                    resp = errors.APIError(405, f"{scope['method']} {scope['path']}: use POST",
                                           "invalid_request_error", None, "method_not_allowed").response()
                    await resp(scope, receive, send)
                    return
                api = self.api
                api.active += 1
                api.admitted += 1
                try:
                    resp = await handler(Request(scope, receive))
                    await resp(scope, receive, send)
                finally:
                    api.active -= 1
                return
        await self.app(scope, receive, send)


def _prompt_estimate(request: Request | None) -> int:
    """Prompt tokens when the upstream reports no usage: about 4 bytes of request body per token."""
    if request is None:
        return 0
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


def create_app(config: GatewayConfig, state: StateStore | None = None) -> FastAPI:
    """Build the app. Policies load here, so a bad policy fails before the server starts."""
    metrics = Metrics()
    gateway = Gateway(state or MemoryStore())
    api = Api(config, gateway, metrics)
    gateway.call_pool = _pool_caller(api)
    gateway.load(config.policies)
    metrics.attach_live(gateway.all_pools, lambda: (gateway.state.kind, gateway.state.healthy()))
    sync = api.sync = StateSync(gateway.registry, gateway.state, config.sync_interval)
    metrics.registry.register(sync.collector())
    if config.keystore is not None:
        from switchyard.auth import Auth

        api.auth = Auth(config.keystore, metrics.registry)
        sync.sources.append(api.auth.limiter)

    checker = HealthChecker(
        lambda: [
            (r, min(p.spec.health.interval for p in r.pools), min(p.spec.health.timeout for p in r.pools))
            for r in gateway.registry.by_url.values()
            if r.pools
        ]
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if config.record:
            from switchyard.replay.record import TraceRecorder

            api.recorder = TraceRecorder(config.record)
        if config.health_checks:
            checker.start()
        if config.watch:
            assert gateway.store is not None
            gateway.store.start_watching()
        sync.start()
        if api.auth is not None:
            await api.auth.start()
        # Everything loaded so far lives as long as the process: keep it out of the cyclic
        # GC's generations, so full collections stay short (they showed up in p99).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await sync.aclose()
            if api.auth is not None:
                await api.auth.aclose()
            await checker.aclose()
            if api.recorder is not None:
                api.recorder.close()
            await gateway.aclose()

    app = FastAPI(title="Switchyard", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    # The three proxy endpoints skip FastAPI's router and dependency machinery: a pure ASGI
    # middleware answers them (it measured ~2x the requests/s of the same handler as a route).
    app.add_middleware(FastPath, api=api)
    app.state.api = api
    app.state.gateway = gateway
    app.state.metrics = metrics

    @app.exception_handler(errors.APIError)
    async def _api_error(request: Request, exc: errors.APIError) -> Response:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return Response(errors.error_body(msg, kind), exc.status_code, media_type=JSON)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        return errors.bad_request(str(exc.errors()[:3])).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return Response(errors.error_body(f"internal error: {type(exc).__name__}", "server_error"), 500,
                        media_type=JSON)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        if api.auth is not None:
            await api.auth.authenticate(request.headers)
        return api.models()

    @app.get("/health")
    async def health() -> Response:
        return Response(orjson.dumps(api.health()), media_type=JSON)

    @app.get("/health/ready")
    async def ready() -> Response:
        """Readiness for a load balancer: 503 from SIGTERM on (the gateway is draining)."""
        body = {"ready": not api.draining, "draining": api.draining, "inflight": api.active}
        return Response(orjson.dumps(body), 503 if api.draining else 200, media_type=JSON)

    @app.get("/health/live")
    async def live() -> Response:
        return Response(b'{"live":true}', media_type=JSON)

    if config.admin_key:
        from switchyard.api.admin import install_admin

        install_admin(app, api, sync, config.admin_key)

    if config.ui:  # the browser UI (issue 10): dashboard, policy editor, replay reports
        from switchyard.api.ui import ui_router

        app.include_router(ui_router(api, config.reports_dir))

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def _pool_caller(api: Api):
    """call_pool(pool, body, timeout) for the llm classifier: a chat completion through a pool."""

    async def call_pool(pool_name: str, body: dict, timeout: float) -> dict:
        lps = [lp for lp in api.gateway.policies() if pool_name in lp.pools]
        if not lps:
            raise LookupError(f"no pool named {pool_name!r}")
        lp = lps[0]
        decision = RouteDecision(lp.name, pool_name, "classifier", "classifier call", NO_LABEL)
        answer = await asyncio.wait_for(api.dispatcher.send(lp, decision, dict(body), "/chat/completions", False),
                                        timeout)
        if answer.status != 200:
            raise RuntimeError(f"classifier pool {pool_name!r} answered {answer.status}")
        return orjson.loads(answer.body)

    return call_pool
