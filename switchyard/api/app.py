"""The gateway's HTTP face: an OpenAI-compatible API on FastAPI.

`create_app` puts the pieces together: the Gateway and its Runtime (gateway/), the proxy
endpoints (api/proxy.py), health, models and metrics, the admin API (api/admin.py) and the UI
(api/ui.py); background work (health checks, policy watching, state sync, key refresh) starts
and stops with the app's lifespan.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from switchyard import errors
from switchyard.api import dry_run
from switchyard.api import errors as http_errors
from switchyard.api.body import DEFAULT_LIMITS, BodyLimits
from switchyard.api.fast_path import FastPath
from switchyard.api.guard import EdgeGuard, GuardConfig
from switchyard.api.messages import MESSAGES
from switchyard.api.proxy import Proxy
from switchyard.api.responses import ResponsesDialect
from switchyard.api.safe_headers import SafeHeaders, safe_send
from switchyard.gateway.auth import Auth, check_admin
from switchyard.gateway.gateway import Gateway
from switchyard.gateway.keys import KeyStore
from switchyard.gateway.metrics import Metrics
from switchyard.gateway.runtime import Runtime
from switchyard.gateway.usage import MAX_EVENT_BYTES
from switchyard.policy.schema import LoadSpec
from switchyard.pools.health import HealthChecker
from switchyard.pools.load import LoadPoller
from switchyard.pools.replica import Replica
from switchyard.pools.sync import StateSync
from switchyard.state.base import RESPONSE_TTL, StateStore
from switchyard.state.memory import MemoryStore

if TYPE_CHECKING:  # OpenTelemetry's SDK loads only when tracing is on
    from switchyard.gateway.tracing import Tracing

log = logging.getLogger("switchyard.api")

JSON = "application/json"


class GatewayApp(FastAPI):
    """FastAPI for everything but the proxy paths, which go straight to their own ASGI chain
    (edge guard, safe headers, api/fast_path.FastPath): the same checks, a third of the layers."""

    fast: ASGIApp | None = None
    fast_paths: frozenset[str] = frozenset()
    fast_guard: EdgeGuard | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = self.fast
        if fast is not None and scope["type"] == "http" and scope["path"] in self.fast_paths:
            # What SafeHeaders(EdgeGuard(fast)) does, in this one frame (two fewer a request).
            send = safe_send(send)
            if self.fast_guard is not None:
                receive, refusal = self.fast_guard.admit(scope, receive)
                if refusal is not None:
                    await refusal(scope, receive, send)
                    return
            await fast(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def starlette_call(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


# What the lifespan's closing may take in all, after the drain: a gateway asked to stop exits,
# whatever one of its parts does. Test runs saw a --redis gateway sit in "Waiting for application
# shutdown" until it was killed 10 s later (rarely; the stalled part was not caught).
SHUTDOWN_BUDGET_S = 5.0

CloseStep = tuple[str, Callable[[], Awaitable[object]] | None]


async def close_in_order(steps: list[CloseStep], budget: float) -> list[str]:
    """Run each close in turn within one shared deadline. A close that overruns is left behind
    (cancelled, not awaited: it may not honour cancellation) and named in a warning; the later
    ones still run. Returns the names of those left behind."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    left_behind: list[str] = []
    for name, close in steps:
        if close is None:
            continue
        task = asyncio.ensure_future(close())
        done, _ = await asyncio.wait({task}, timeout=max(0.05, deadline - loop.time()))
        if not done:
            task.cancel()
            left_behind.append(name)
            log.warning("shutdown: closing %s did not finish within the %g s budget; exiting without it",
                        name, budget)
        elif not task.cancelled() and task.exception() is not None:
            log.error("shutdown: closing %s failed: %r", name, task.exception())
    return left_behind


@dataclass
class GatewayConfig:
    policies: list[str | Path]
    max_body_bytes: int = 16 * 1024 * 1024
    body_limits: BodyLimits = DEFAULT_LIMITS  # the work one request body may cost (api/body.py)
    max_event_bytes: int = MAX_EVENT_BYTES  # one upstream SSE event at most
    watch: bool = True
    health_checks: bool = True
    record: str | None = None
    keystore: KeyStore | None = None  # API keys required when set (gateway/auth.py)
    admin_key: str | None = None  # mounts the admin API (api/admin.py)
    sync_interval: float = 0.05  # shared-state sync tick, seconds (with --redis)
    ui: bool = True  # the browser UI at /ui (api/ui.py)
    reports_dir: str | None = None  # replay reports shown by the UI
    body_timeout: float = 30.0  # longest wait for the next piece of a request body (408 after it)
    allowed_hosts: tuple[str, ...] = ()  # open mode: Host names served besides loopback ones
    check_host: bool = True  # open mode: refuse Host names that are not loopback (off: --insecure-open)
    classifier_dirs: tuple[str, ...] = ()  # folders besides the policy's and the shipped one for ONNX models
    ui_session_ttl: float = 8 * 3600.0  # seconds a UI login lasts (the server forgets the token then)
    responses_ttl: float = RESPONSE_TTL  # seconds a stored Responses answer lives (store: true)
    max_upstream_body: int = 32 * 1024 * 1024  # largest non-stream upstream answer (502 beyond it)
    allow_env: tuple[str, ...] = ()  # ${NAME}s a policy may expand besides SWITCHYARD_* (fnmatch patterns)
    record_max_bytes: int = 256 * 1024 * 1024  # --record: rotate the trace past this size
    record_keep: int = 3  # --record: rotated files kept (trace.jsonl.1 .. .N)

    @property
    def open_mode(self) -> bool:
        """No API keys: anyone who reaches the gateway may use it, so it must only be reachable locally."""
        return self.keystore is None


def create_app(config: GatewayConfig, state: StateStore | None = None, tracing: Tracing | None = None) -> FastAPI:
    """Build the app. Policies load here, so a bad policy fails before the server starts.
    `tracing` (gateway/tracing.py, built by the caller only when tracing is on) traces requests."""
    metrics = Metrics()
    gateway = Gateway(state or MemoryStore(), metrics, config.classifier_dirs, config.allow_env)
    gateway.dispatcher.max_body = config.max_upstream_body
    gateway.load(config.policies)
    metrics.attach_live(gateway.all_pools, lambda: (gateway.state.kind, gateway.state.healthy()))
    sync = StateSync(gateway.registry, gateway.state, config.sync_interval)
    metrics.registry.register(sync.collector())
    auth = Auth(config.keystore, metrics.registry) if config.keystore is not None else None
    if auth is not None:
        sync.sources.append(auth.limiter)
    rt = Runtime(gateway, metrics, sync, auth)
    rt.tracer = tracing
    responses = ResponsesDialect(gateway.state, config.responses_ttl)
    proxy = Proxy(rt, {"/v1/responses": responses, "/v1/messages": MESSAGES})
    proxy.limits, proxy.max_event_bytes = config.body_limits, config.max_event_bytes

    checker = HealthChecker(
        lambda: [
            (r, min(p.spec.health.interval for p in r.pools), min(p.spec.health.timeout for p in r.pools))
            for r in gateway.registry.by_url.values()
            if r.pools
        ]
    )

    def least_load_replicas() -> list[tuple[Replica, LoadSpec]]:
        out = []
        for r in gateway.registry.by_url.values():
            specs = [p.spec.load for p in r.pools if p.spec.strategy == "least_load"]
            if specs:
                out.append((r, min(specs, key=lambda s: s.interval)))
        return out

    poller = LoadPoller(least_load_replicas, sync.owns)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if config.record:
            from switchyard.gateway.recorder import TraceRecorder

            rt.recorder = TraceRecorder(config.record, config.record_max_bytes, config.record_keep)
        if config.health_checks:
            checker.start()
        poller.start()
        if config.watch:
            assert gateway.store is not None
            gateway.store.start_watching()
        sync.start()
        if auth is not None:
            await auth.start()
        # Everything loaded so far lives as long as the process: keep it out of the cyclic
        # GC's generations, so full collections stay short (they showed up in p99).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            recorder = rt.recorder
            await close_in_order([
                ("state sync", sync.aclose),
                ("auth", auth.aclose if auth is not None else None),
                ("health checks", checker.aclose),
                ("load polling", poller.aclose),
                ("trace recorder", (lambda: asyncio.to_thread(recorder.close)) if recorder is not None else None),
                ("gateway", gateway.aclose),
                # export what is left, off the event loop
                ("tracing", (lambda: asyncio.to_thread(tracing.shutdown)) if tracing is not None else None),
            ], SHUTDOWN_BUDGET_S)

    app = GatewayApp(title="Switchyard", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    guard = GuardConfig(
        max_body_bytes=config.max_body_bytes, body_timeout=config.body_timeout,
        open_mode=config.open_mode, check_host=config.check_host, allowed_hosts=frozenset(config.allowed_hosts))
    # Outermost: refuse what the front door must refuse before any handler reads a byte.
    app.add_middleware(EdgeGuard, config=guard)
    app.add_middleware(SafeHeaders)  # nosniff on every answer, no control byte in a header value
    # The proxy paths skip FastAPI and Starlette's stack (its router, error middleware, FastAPI's
    # per-request telemetry check): the same edge checks, wrapped directly around the proxy.
    fast = FastPath(app.starlette_call, proxy)
    app.fast, app.fast_guard = fast, EdgeGuard(fast, guard)
    app.fast_paths = frozenset(fast.routes)
    app.state.runtime = rt
    app.state.gateway = gateway

    @app.exception_handler(errors.RequestError)
    async def _request_error(request: Request, exc: errors.RequestError) -> Response:
        return http_errors.response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return Response(http_errors.error_body(msg, kind), exc.status_code, media_type=JSON)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        return http_errors.response(errors.BadRequest(str(exc.errors()[:3])))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return Response(http_errors.error_body(f"internal error: {type(exc).__name__}", "server_error"), 500,
                        media_type=JSON)

    async def caller_of(request: Request) -> str:
        """Whose stored responses a request may see: its API key's id ("" in open mode)."""
        if auth is None:
            return ""
        return (await auth.authenticate(request.headers)).id

    def no_response(rid: str) -> Response:
        return Response(http_errors.error_body(f"Response with id '{rid}' not found.", "invalid_request_error",
                                               "response_id"), 404, media_type=JSON)

    @app.get("/v1/responses/{rid}")
    async def get_response(rid: str, request: Request) -> Response:
        raw = await responses.retrieve(await caller_of(request), rid)
        return no_response(rid) if raw is None else Response(raw, media_type=JSON)

    @app.get("/v1/responses/{rid}/input_items")
    async def response_input_items(rid: str, request: Request, order: str = "desc", limit: int = 20,
                                   after: str | None = None) -> Response:
        items = await responses.input_items(await caller_of(request), rid)
        if items is None:
            return no_response(rid)
        if order not in ("asc", "desc"):
            raise errors.BadRequest("order must be asc or desc", "order")
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [i["id"] for i in items]
            items = items[ids.index(after) + 1:] if after in ids else []
        page = items[:max(1, min(limit, 100))]
        return Response(orjson.dumps({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                                      "last_id": page[-1]["id"] if page else None,
                                      "has_more": len(items) > len(page)}), media_type=JSON)

    @app.delete("/v1/responses/{rid}")
    async def delete_response(rid: str, request: Request) -> Response:
        if not await responses.delete(await caller_of(request), rid):
            return no_response(rid)
        return Response(orjson.dumps({"id": rid, "object": "response", "deleted": True}), media_type=JSON)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        key = await auth.authenticate(request.headers) if auth is not None else None
        return dry_run.models(rt, key)  # a key sees what it may use

    def details_allowed(request: Request) -> bool:
        """Pools, replica URLs, errors and key names are for the operator: the admin key holder,
        or anyone in open mode without an admin key (it serves loopback only)."""
        if config.admin_key:
            return check_admin(request.headers, config.admin_key)
        return config.open_mode

    proxy.show_details = lambda headers: (check_admin(headers, config.admin_key) if config.admin_key
                                          else config.open_mode)

    @app.get("/health")
    async def health(request: Request) -> Response:
        """Liveness and readiness for anyone; the details with the admin key."""
        full = rt.health()
        body = full if details_allowed(request) else {"status": full["status"], "ready": full["ready"]}
        return Response(orjson.dumps(body), media_type=JSON)

    @app.get("/health/ready")
    async def ready() -> Response:
        """Readiness for a load balancer: 503 from SIGTERM on (the gateway is draining)."""
        body = {"ready": not rt.draining, "draining": rt.draining, "inflight": rt.active}
        return Response(orjson.dumps(body), 503 if rt.draining else 200, media_type=JSON)

    @app.get("/health/live")
    async def live() -> Response:
        return Response(b'{"live":true}', media_type=JSON)

    if config.admin_key:
        from switchyard.api.admin import admin_router

        app.include_router(admin_router(rt, config.admin_key))

    if config.ui:  # the browser UI: dashboard, policy editor, replay reports
        from switchyard.api.ui import ui_router

        app.include_router(ui_router(rt, config.admin_key, config.keystore is not None, config.reports_dir,
                                     config.ui_session_ttl))

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        if not details_allowed(request):
            raise errors.Unauthorized("/metrics: send 'Authorization: Bearer ADMIN_KEY' (a scrape config's "
                                      "bearer token)", code="invalid_admin_key")
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
