"""The endpoints the gateway answers without calling an upstream: POST /v1/route (the decision a
request would get, dry: the session's state is read, never written), POST
/v1/messages/count_tokens (a prompt's tokens by the tokenizer of the pool it would go to) and GET
/v1/models (the names `model` may take). They authenticate, bound and parse a body as the proxy
does (api/proxy.py), and share its routing up to the upstream call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from switchyard import errors
from switchyard.api import errors as http_errors
from switchyard.api.body import bounded, check_request, parse_json
from switchyard.api.chat import CHAT, COMPLETIONS
from switchyard.api.dialect import Dialect, Parsed
from switchyard.api.messages import (
    MESSAGES,
    count_text,
    count_tokens_body,
    count_tokens_input,
    estimate_tokens,
)
from switchyard.api.openai import decision_headers
from switchyard.api.proxy import JSON, Proxy
from switchyard.classify.features import Features, extract
from switchyard.gateway.auth import may_use, resolve_for
from switchyard.gateway.gateway import Target
from switchyard.gateway.keys import KeyRecord
from switchyard.gateway.requests import kind_of
from switchyard.gateway.routing import Routed, session_id_of
from switchyard.gateway.runtime import Runtime
from switchyard.pools.tokenize import count_tokens as pool_count_tokens

ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "image", "document", "thinking"})


async def _route_dry(proxy: Proxy, request: Request,
                     parse: Callable[[bytes], tuple[Parsed, Features]]) -> tuple[Parsed, Features, Target, Routed]:
    """A request routed as the proxy would route it, without committing the session's state:
    authenticated, its body bounded and parsed by `parse`, its key's limits and pools checked (a dry
    run is a request: rpm counts it). A Responses chain's stored history joins it first, as in the
    proxy, read but never written."""
    rt, headers, limits = proxy.rt, request.headers, proxy.limits
    key = await rt.auth.authenticate(headers) if rt.auth is not None else None
    parsed, features = await bounded(await proxy.read_raw(request), parse, limits)
    body = parsed.chat
    target = proxy.target(body["model"], key)
    if key is not None and rt.auth is not None:
        rt.auth.admit_key(key, body["model"], target)
    prepare = getattr(dialect_of(proxy, parsed.native, parsed.api), "prepare", None)
    if prepare is not None:
        n = len(body["messages"])
        await prepare(parsed, key.id if key else "", True)
        if len(body["messages"]) != n:  # its history joined: routed on all of it, as the proxy does
            check_request(body, limits)
            features = extract(body, headers)
    routed = await rt.gateway.route(target, features, body, session_id_of(body, headers, parsed.session_hint),
                                    key.id if key else "", commit=False)
    if key is not None and rt.auth is not None:
        rt.auth.check_pool(key, body["model"], routed.decision.pool)
    return parsed, features, target, routed


async def route_only(proxy: Proxy, request: Request) -> Response:
    """POST /v1/route: the routing decision's trace, in any of the client APIs (`?api=` or the
    body's shape, dialect_of); with the operator's details (replicas) where proxy.show_details says."""
    headers, limits = request.headers, proxy.limits
    api = request.query_params.get("api")

    def parse(raw: bytes) -> tuple[Parsed, Features]:
        body = parse_json(raw, limits)
        if isinstance(body, dict) and "model" not in body:
            body = {**body, "model": "auto"}
        dialect = dialect_of(proxy, body, api)
        # A Messages body needs no max_tokens to be routed (count_tokens' parse takes it so).
        parsed = count_tokens_input(body, headers) if dialect is MESSAGES else dialect.parse(body, headers)
        check_request(parsed.chat, limits)
        return parsed, extract(parsed.chat, headers)

    try:
        parsed, features, target, routed = await _route_dry(proxy, request, parse)
    except errors.RequestError as e:
        return http_errors.response(e)
    out = routed.trace()
    out["api"] = parsed.api
    pool = target.policy.pools[routed.decision.pool]
    out["upstream_model"] = pool.model
    if proxy.show_details(headers):  # replica URLs, health, errors, in-flight: the operator's
        out["replicas"] = [r.snapshot() for r in pool.replicas]
    out["features"] = features.summary()
    return Response(orjson.dumps(out), 200, headers=decision_headers(routed.decision), media_type=JSON)


def dialect_of(proxy: Proxy, body: Any, api: str | None) -> Dialect:
    """Which API a /v1/route body speaks: `?api=` says, else its shape: `input` is Responses;
    `messages` with a top-level `system`, `stop_sequences`, tools with `input_schema` or
    tool_use/tool_result blocks is Anthropic Messages; `prompt` is Completions; else Chat. A
    Messages body with none of those routes as the same chat body would (one normalised form)."""
    by_api = {"chat": CHAT, "completions": COMPLETIONS, **{d.api: d for d in proxy.dialects.values()}}
    if api is not None:
        if api not in by_api:
            raise errors.BadRequest(f"api must be one of {sorted(by_api)}, got {api!r}", "api")
        return by_api[api]
    if not isinstance(body, dict):
        return CHAT
    if "input" in body and "messages" not in body and "responses" in by_api:
        return by_api["responses"]
    if "messages" in by_api and _anthropic_shaped(body):
        return by_api["messages"]
    return COMPLETIONS if kind_of(body) == "completions" else CHAT


def _anthropic_shaped(body: dict) -> bool:
    if "system" in body or "stop_sequences" in body:
        return True
    tools = body.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools):
        return True
    msgs = body.get("messages")
    return isinstance(msgs, list) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list)
        and any(isinstance(b, dict) and b.get("type") in ANTHROPIC_BLOCKS for b in m["content"]) for m in msgs)


async def count_tokens(proxy: Proxy, request: Request) -> Response:
    """POST /v1/messages/count_tokens: the prompt's tokens by the tokenizer of the pool the request
    would go to (its replica's /tokenize), else a stated estimate (x-switchyard-token-count)."""
    headers, limits = request.headers, proxy.limits

    def parse(raw: bytes) -> tuple[Parsed, Features]:
        parsed = count_tokens_input(parse_json(raw, limits), headers)
        check_request(parsed.chat, limits)
        return parsed, extract(parsed.chat, headers)

    try:
        parsed, _, target, routed = await _route_dry(proxy, request, parse)
    except errors.RequestError as e:
        return http_errors.response(e, None, MESSAGES)
    body = parsed.chat
    pool = target.policy.pools[routed.decision.pool]
    out = decision_headers(routed.decision)
    counted = await pool_count_tokens(pool, body, count_text(body))
    if counted is None:
        n = estimate_tokens(body)
        out["x-switchyard-token-count"] = "estimate: about 4 characters a token (the pool has no /tokenize)"
    else:
        n, how = counted
        out["x-switchyard-token-count"] = f"tokenizer of pool {routed.decision.pool} ({how})"
    return Response(count_tokens_body(n), headers=out, media_type=JSON)


def models(rt: Runtime, key: KeyRecord | None = None) -> Response:
    """GET /v1/models: every name `model` may take, or for a key only those it may use (resolved as
    its requests are: within its own policies)."""
    data = []
    created = int(rt.started)
    gw = rt.gateway
    for name, t in gw.model_names():
        if key is not None:
            mine = resolve_for(gw, name, key)
            if mine is None or not may_use(key, mine.policy.name, mine.pool):
                continue
            t = mine
        if t.pool is None:
            meta = {"kind": "policy", "policy": t.policy.name}
        elif name == t.pool:
            meta = {"kind": "pool", "policy": t.policy.name, "pool": t.pool}
        else:
            meta = {"kind": "upstream", "policy": t.policy.name, "pool": t.pool}
        data.append({"id": name, "object": "model", "created": created, "owned_by": "switchyard",
                     "switchyard": meta})
    return Response(orjson.dumps({"object": "list", "data": data}), media_type=JSON)
