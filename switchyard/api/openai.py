"""The OpenAI request shapes the gateway checks, and the x-switchyard-* headers it answers with.

Only what routing needs is validated; every other field goes upstream untouched.
"""

from __future__ import annotations

from typing import Any

from switchyard.api import errors
from switchyard.policy.rules import RouteDecision

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def session_id_of(body: dict, headers: Any) -> str | None:
    sid = headers.get("x-session-id")
    if sid:
        return sid
    meta = body.get("metadata")
    if isinstance(meta, dict):
        s = meta.get("session_id")
        if isinstance(s, str) and s:
            return s
    user = body.get("user")
    return user if isinstance(user, str) and user else None


def validate(body: Any, kind: str) -> dict:
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise errors.bad_request("you must provide a model parameter", "model")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise errors.bad_request("'stream' must be a boolean", "stream")
    if kind == "chat":
        msgs = body.get("messages")
        if msgs is None:
            raise errors.bad_request("'messages' is a required property", "messages")
        if not isinstance(msgs, list):
            raise errors.bad_request("'messages' must be an array of message objects", "messages")
        if not msgs:
            raise errors.bad_request("'messages' must contain at least one message", "messages")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise errors.bad_request(f"messages[{i}] must be an object", f"messages[{i}]")
            role = m.get("role")
            if role not in ROLES:
                raise errors.bad_request(
                    f"messages[{i}].role must be one of {sorted(ROLES)}, got {role!r}", f"messages[{i}].role"
                )
            c = m.get("content")
            if c is not None and not isinstance(c, str | list):
                raise errors.bad_request(f"messages[{i}].content must be a string, an array or null",
                                         f"messages[{i}].content")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise errors.bad_request("'tools' must be an array", "tools")
    else:
        p = body.get("prompt")
        if p is None:
            raise errors.bad_request("'prompt' is a required property", "prompt")
        if not isinstance(p, str | list):
            raise errors.bad_request("'prompt' must be a string or an array", "prompt")
    return body


def decision_headers(d: RouteDecision) -> dict[str, str]:
    lab = d.label
    h = {
        "x-switchyard-policy": d.policy,
        "x-switchyard-pool": d.pool,
        "x-switchyard-rule": d.rule,
        "x-switchyard-label": lab.name or "none",
    }
    if lab.name:
        h["x-switchyard-confidence"] = f"{lab.confidence:.4f}"
        h["x-switchyard-classifier"] = lab.kind
        h["x-switchyard-classifier-ms"] = f"{lab.ms:.3f}"
    return h
