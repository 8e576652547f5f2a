"""Admin API (its own key) and the gateway's own drain on SIGTERM.

    POST /admin/reload                         re-read every policy file (an invalid one keeps serving)
    GET  /admin/replicas                       every replica: state, in flight here and elsewhere
    POST /admin/replicas/{name}/drain          no new requests; wait for in-flight ones; mark drained
                                               (?timeout=30; ?wait=false returns at once)
    POST /admin/replicas/{name}/undrain        back in service
    GET  /admin/sessions?limit=100             session decisions (shared ones with --redis)
    GET  /admin/keys                           API keys (names, limits, usage this minute; never hashes)

`name` is a replica's name or its URL. Drains and undrains reach every gateway sharing the
Redis. Without --admin-key the admin API is not mounted (404).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from switchyard.errors import NotFound, Unauthorized
from switchyard.gateway.auth import check_admin
from switchyard.gateway.runtime import Runtime
from switchyard.pools.replica import Replica

log = logging.getLogger("switchyard.admin")


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status, media_type="application/json")


def admin_router(rt: Runtime, admin_key: str) -> APIRouter:
    async def require_admin(request: Request) -> None:
        if not check_admin(request.headers, admin_key):
            raise Unauthorized("admin API: send 'Authorization: Bearer ADMIN_KEY'", code="invalid_admin_key")

    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])
    gateway = rt.gateway
    sync = rt.sync

    def find(name: str) -> Replica:
        reg = gateway.registry.by_url
        r = reg.get(name) or next((r for r in reg.values() if r.name == name), None)
        if r is None:
            raise NotFound(f"no replica named {name!r}; GET /admin/replicas lists them", code="replica_not_found")
        return r

    @router.post("/reload")
    async def reload() -> Response:
        assert gateway.store is not None
        sts = await gateway.store.reload_all()
        body = {"reloaded": [{"file": s.file, "ok": s.ok, "error": s.error or None} for s in sts],
                "policies": [lp.name for lp in gateway.policies()]}
        return _json(body, 200 if all(s.ok for s in sts) else 422)

    @router.get("/replicas")
    async def replicas() -> Response:
        out = []
        for r in gateway.registry.by_url.values():
            snap = r.snapshot()
            snap["pools"] = sorted({p.name for p in r.pools})
            out.append(snap)
        return _json({"replicas": out, "state": gateway.state.describe()})

    @router.post("/replicas/{name:path}/drain")
    async def drain(name: str, timeout: float = 30.0, wait: bool = True) -> Response:
        r = find(name)
        if not wait:
            task = asyncio.get_running_loop().create_task(sync.drain(r, timeout))
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
            await asyncio.sleep(0)
            return _json({"replica": r.name, "state": r.state}, 202)
        t0 = time.monotonic()
        done = await sync.drain(r, timeout)
        body = {"replica": r.name, "url": r.url, "state": r.state, "drained": done,
                "waited_s": round(time.monotonic() - t0, 3), "inflight": r.inflight,
                "remote_inflight": r.remote_inflight}
        return _json(body, 200 if done else 504)

    @router.post("/replicas/{name:path}/undrain")
    async def undrain(name: str) -> Response:
        r = find(name)
        await sync.undrain(r)
        return _json({"replica": r.name, "url": r.url, "state": r.state})

    @router.get("/sessions")
    async def sessions(limit: int = 100) -> Response:
        recs = await gateway.state.list_sessions(max(1, min(limit, 10_000)))
        out = []
        for key, rec in recs.items():
            parts = key.split("\0", 2)
            policy, caller, sid = parts if len(parts) == 3 else (parts[0], "", parts[-1])
            out.append({"policy": policy, "caller": caller or None, "session_id": sid, "pool": rec.pool, "label": rec.label or None,
                        "confidence": rec.confidence, "replica": rec.replica, "rule": rec.rule, "turns": rec.turns})
        return _json({"sessions": out, "state": gateway.state.kind})

    @router.get("/keys")
    async def keys() -> Response:
        auth = rt.auth
        if auth is None:
            return _json({"auth": False, "keys": []})
        now = time.time()
        out = []
        for k in auth.records():
            d = k.public()
            d["used_this_minute"] = {"requests": auth.limiter.used(k.id, "r", now),
                                     "tokens": auth.limiter.used(k.id, "t", now)}
            out.append(d)
        return _json({"auth": True, "store": auth.store.where, "keys": out})

    return router
