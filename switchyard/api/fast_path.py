"""The proxy paths' ASGI entry: POST /v1/chat/completions, /v1/completions, /v1/route and each
dialect's paths go straight to api/proxy.Proxy (no router, no dependency injection: ~2x the
requests/s of the same handlers as FastAPI routes); every other request goes on to the app."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from switchyard import errors
from switchyard.api import dry_run
from switchyard.api import errors as http_errors
from switchyard.api.chat import CHAT, COMPLETIONS
from switchyard.api.dialect import Dialect

if TYPE_CHECKING:
    from switchyard.api.proxy import Proxy

log = logging.getLogger("switchyard.api")
JSON = "application/json"


class FastPath:
    """Pure ASGI middleware: POST /v1/chat/completions, /v1/completions and /v1/route (api/dry_run.py)."""

    def __init__(self, app: ASGIApp, proxy: Proxy):
        self.app = app
        self.rt = proxy.rt
        self.routes = {
            "/v1/chat/completions": lambda r, t: proxy.proxy(r, CHAT, t),
            "/v1/completions": lambda r, t: proxy.proxy(r, COMPLETIONS, t),
            "/v1/route": lambda r, t: dry_run.route_only(proxy, r),
        }
        self.shapes: dict[str, Dialect] = dict(proxy.dialects)
        if "/v1/messages" in proxy.dialects:
            self.routes["/v1/messages/count_tokens"] = lambda r, t: dry_run.count_tokens(proxy, r)
            self.shapes["/v1/messages/count_tokens"] = proxy.dialects["/v1/messages"]
        for path, dialect in proxy.dialects.items():
            self.routes[path] = lambda r, t, d=dialect: proxy.proxy(r, d, t)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            handler = self.routes.get(scope["path"])
            if handler is not None:
                if scope["method"] != "POST":
                    shape = self.shapes.get(scope["path"])  # Messages' paths answer in Anthropic's shape
                    resp = http_errors.response(errors.MethodNotAllowed(f"{scope['method']} {scope['path']}: use POST"),
                                                None, shape)
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
                    try:
                        resp = await handler(request, trace)
                    except Exception as exc:  # as Starlette's ServerErrorMiddleware: a 500 in our shape
                        log.exception("unexpected error on %s %s", scope["method"], scope["path"])
                        resp = Response(http_errors.error_body(f"internal error: {type(exc).__name__}",
                                                               "server_error"), 500, media_type=JSON)
                        await resp(scope, receive, send)
                        raise
                    await resp(scope, receive, send)
                finally:
                    rt.active -= 1
                    if trace is not None:
                        trace.end()
                return
        await self.app(scope, receive, send)
