"""The /ui routes: the page, its data (polled once a second), the policy editor, replay reports.

    GET  /ui                         the page (static; it asks /ui/api/session whether to log in)
    GET  /ui/static/{file}           its CSS and JS
    GET  /ui/api/session             {"auth": open|admin|locked, "ok": bool}
    POST /ui/api/login {"key"}       admin key -> session cookie;  POST /ui/api/logout
    GET  /ui/api/live?window=60      pools, replicas, split, series, classifier, recent decisions
    GET  /ui/api/policies            the running policies with their files' text
    GET  /ui/api/schema              the policy JSON Schema (+ rule predicate names) for completion
    POST /ui/api/policies/validate   {"name", "text"} -> {"ok", "issues": [{"line", "reason"}]}
    POST /ui/api/policies/preview    {"name", "text", "request", "headers"} -> decisions, rule trace
    POST /ui/api/policies/apply      {"name", "text"} -> 200 applied | 422 issues (old policy stays)
    GET  /ui/api/reports             replay reports under --reports DIR
    GET  /ui/reports/{id}/{file}     a report's HTML or image

Everything but the page and its static files needs the admin key when the gateway has one.
"""

from __future__ import annotations

import ipaddress
import math
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import FileResponse, RedirectResponse, Response

from switchyard.api.proxy import parse_json
from switchyard.errors import BadRequest, Forbidden, NotFound, Unauthorized
from switchyard.gateway.requests import kind_of
from switchyard.gateway.requests import validate as validate_request
from switchyard.gateway.runtime import Runtime
from switchyard.ui import STATIC
from switchyard.ui.access import COOKIE, SESSION_TTL_S, UiAccess
from switchyard.ui.editor import PolicyEditor, issue_dicts, redact_secrets, schema_hints
from switchyard.ui.live import LiveSampler
from switchyard.ui.reports import list_reports, report_file

STATIC_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(obj), status, media_type="application/json",
                    headers={"cache-control": "no-store", **(headers or {})})


def _static(name: str) -> Response:
    p = (STATIC / name).resolve()
    if p.parent != STATIC or p.suffix not in STATIC_TYPES or not p.is_file():
        raise NotFound(f"no UI file {name!r}", code="not_found")
    return Response(p.read_bytes(), media_type=STATIC_TYPES[p.suffix], headers={"cache-control": "no-cache"})


def _loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ui_router(rt: Runtime, admin_key: str | None, keys_on: bool, reports_dir: str | Path | None = None,
              session_ttl: float = SESSION_TTL_S) -> APIRouter:
    access = UiAccess(admin_key, keys_on, ttl=session_ttl)
    sampler = LiveSampler(rt)
    editor = PolicyEditor(rt.gateway)
    reports = Path(reports_dir).expanduser() if reports_dir else None

    @asynccontextmanager
    async def lifespan(_app: Any):
        sampler.start()
        try:
            yield
        finally:
            await sampler.aclose()
            await editor.aclose()

    async def require(request: Request) -> None:
        if access.allowed(request.headers, request.cookies):
            return
        if access.mode == "locked":
            raise Forbidden("the UI needs an admin key when API keys are on: serve with --admin-key",
                            code="ui_locked")
        raise Unauthorized("the UI needs the admin key: log in on /ui or send 'Authorization: Bearer ADMIN_KEY'",
                           code="invalid_admin_key")

    async def body_of(request: Request) -> dict:
        # JSON only: a cross-site form cannot send it without a CORS preflight we never answer.
        if not request.headers.get("content-type", "").startswith("application/json"):
            raise BadRequest("send the body as application/json")
        body = parse_json(await request.body())  # bounded in size and time by api/guard.py
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    def edit_args(body: dict) -> tuple[str, str]:
        name, text = body.get("name"), body.get("text")
        if not isinstance(name, str) or not isinstance(text, str):
            raise BadRequest("send {\"name\": POLICY, \"text\": YAML}")
        return name, text

    page = APIRouter(lifespan=lifespan)
    data = APIRouter(prefix="/ui", dependencies=[Depends(require)])

    @page.get("/ui", include_in_schema=False)
    async def index() -> Response:
        return _static("index.html")

    @page.get("/ui/", include_in_schema=False)
    async def index_slash() -> Response:
        return RedirectResponse("/ui", 308)

    @page.get("/ui/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        return _static(name)

    @page.get("/ui/api/session")
    async def session(request: Request) -> Response:
        return _json({"auth": access.mode, "ok": access.allowed(request.headers, request.cookies)})

    @page.post("/ui/api/login")
    async def login(request: Request) -> Response:
        client = request.client.host if request.client else ""
        wait = access.retry_after(client)
        if wait > 0:
            return _json({"ok": False, "error": f"too many failed logins: try again in {wait:.0f}s"}, 429,
                         {"Retry-After": str(max(1, round(wait)))})
        body = await body_of(request)
        key = body.get("key")
        if access.mode != "admin":
            return _json({"ok": False, "error": f"no login: the UI is {access.mode}"}, 400)
        token = access.login(key, client) if isinstance(key, str) else None
        if token is None:
            return _json({"ok": False, "error": "wrong admin key"}, 401)
        resp = _json({"ok": True})
        # https: served over TLS (--ssl-certfile), or behind a TLS proxy that says so in
        # X-Forwarded-Proto from an address uvicorn trusts (FORWARDED_ALLOW_IPS, loopback by default).
        resp.set_cookie(COOKIE, token, max_age=max(1, math.ceil(access.ttl)), httponly=True, samesite="strict",
                        path="/ui", secure=request.url.scheme == "https")
        return resp

    @page.post("/ui/api/logout")
    async def logout(request: Request) -> Response:
        access.logout(request.cookies)  # the token is dead on the server, whatever the browser keeps
        resp = _json({"ok": True})
        resp.delete_cookie(COOKIE, path="/ui")
        return resp

    @data.get("/api/live")
    async def live(window: float = 60.0) -> Response:
        return _json(sampler.snapshot(min(max(window, 5.0), 300.0)))

    @data.get("/api/policies")
    async def policies() -> Response:
        out = []
        store = rt.gateway.store
        for lp in rt.gateway.policies():
            try:
                text = redact_secrets(lp.path.read_text(encoding="utf-8"))
            except OSError as e:
                text = f"# cannot read {lp.path}: {e}\n"
            st = store.status.get(lp.name) if store else None
            out.append({"name": lp.name, "file": str(lp.path), "text": text,
                        "pools": list(lp.pools), "rules": [r.name for r in lp.compiled.rules],
                        "last_reload": None if st is None else {"ok": st.ok, "at": st.at, "error": st.error or None}})
        return _json({"policies": out})

    @data.get("/api/schema")
    async def schema() -> Response:
        return _json(schema_hints())

    @data.post("/api/policies/validate")
    async def validate(request: Request) -> Response:
        name, text = edit_args(await body_of(request))
        spec, issues = await editor.validate(name, text)
        summary = None if spec is None else {"name": spec.name or name, "pools": list(spec.pools),
                                             "routes": [r.name for r in spec.routes]}
        return _json({"ok": spec is not None, "issues": issue_dicts(issues), "summary": summary})

    @data.post("/api/policies/preview")
    async def preview(request: Request) -> Response:
        body = await body_of(request)
        name, text = edit_args(body)
        req = body.get("request")
        if not isinstance(req, dict):
            raise BadRequest("'request' must be a chat or completions request object")
        req = req if "model" in req else {**req, "model": "auto"}
        validate_request(req, kind_of(req))
        raw_headers = body.get("headers") or {}
        if not isinstance(raw_headers, dict):
            raise BadRequest("'headers' must be an object of NAME: VALUE")
        headers = {str(k).lower(): str(v) for k, v in raw_headers.items()}
        return _json(await editor.preview(name, text, req, headers))

    @data.post("/api/policies/apply")
    async def apply(request: Request) -> Response:
        if access.mode == "open" and not _loopback(request):
            raise Forbidden("without an admin key, policies can be applied from this host only; "
                            "serve with --admin-key to edit from elsewhere", code="ui_apply_loopback_only")
        name, text = edit_args(await body_of(request))
        status, out = await editor.apply(name, text)
        return _json(out, status)

    @data.get("/api/reports")
    async def reports_list() -> Response:
        return _json({"dir": str(reports) if reports else None, "reports": list_reports(reports)})

    @data.get("/reports/{rid}/{name}")
    async def report(rid: str, name: str) -> Response:
        p = report_file(reports, rid, name)
        if p is None:
            raise NotFound(f"no report file {rid}/{name}", code="not_found")
        return FileResponse(p, headers={"cache-control": "no-cache"})

    page.include_router(data)
    return page
