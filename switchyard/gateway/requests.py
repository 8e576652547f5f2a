"""The OpenAI request shapes the gateway checks before it routes (a 400 naming the parameter
otherwise). Only what routing needs and what OpenAI itself refuses is checked; every other field
goes upstream untouched."""

from __future__ import annotations

from typing import Any

from switchyard.errors import BadRequest

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})


def validate(body: Any, kind: str) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter", "model")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", "stream")
    if kind == "chat":
        msgs = body.get("messages")
        if msgs is None:
            raise BadRequest("'messages' is a required property", "messages")
        if not isinstance(msgs, list):
            raise BadRequest("'messages' must be an array of message objects", "messages")
        if not msgs:
            raise BadRequest("'messages' must contain at least one message", "messages")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise BadRequest(f"messages[{i}] must be an object", f"messages[{i}]")
            role = m.get("role")
            if not isinstance(role, str) or role not in ROLES:
                raise BadRequest(
                    f"messages[{i}].role must be one of {sorted(ROLES)}, got {role!r}", f"messages[{i}].role"
                )
            c = m.get("content")
            if c is None and role in CONTENT_REQUIRED:
                # OpenAI answers 400 here too; only an assistant turn may leave it out (tool calls).
                raise BadRequest(f"messages[{i}].content is required for a {role} message",
                                 f"messages[{i}].content")
            if c is not None and not isinstance(c, str | list):
                raise BadRequest(f"messages[{i}].content must be a string, an array or null",
                                 f"messages[{i}].content")
        tools = body.get("tools")
        if tools is not None:
            if not isinstance(tools, list):
                raise BadRequest("'tools' must be an array", "tools")
            for i, t in enumerate(tools):
                fn = t.get("function") if isinstance(t, dict) else None
                if not isinstance(fn, dict):
                    raise BadRequest(f"tools[{i}] must be an object with a 'function'", f"tools[{i}].function")
                name = fn.get("name")
                if not isinstance(name, str) or not name:
                    raise BadRequest(f"tools[{i}].function.name is required", f"tools[{i}].function.name")
    else:
        p = body.get("prompt")
        if p is None:
            raise BadRequest("'prompt' is a required property", "prompt")
        if not isinstance(p, str | list):
            raise BadRequest("'prompt' must be a string or an array", "prompt")
    return body


def kind_of(body: Any) -> str:
    """chat or completions, for a body sent to an endpoint that takes both (/v1/route, the preview)."""
    return "completions" if isinstance(body, dict) and "prompt" in body and "messages" not in body else "chat"
