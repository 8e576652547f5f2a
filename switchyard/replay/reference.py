"""The reference pool: an OpenAI-compatible upstream that answers each replay case with its
reference calls (BFCL's expected answer: the first allowed value of each parameter).

Where no model stronger than the small one is at hand, it stands in for the large pool: its
score is the best any model could reach on those cases, an upper bound, and it answers under
the model name "reference (upper bound)" so every report that shows it says what it is. Put it
in a policy's large pool (or replay straight against it with `--pool large`) and routing can be
measured: how much of the gap between the small model and the reference a router recovers.

It knows the cases it was started with, by their messages and tool names; any other request is
a 400 in OpenAI's error shape. No streaming (replay does not stream), no usage: it runs no model,
so it has no tokens to count.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from aiohttp import web

from switchyard.replay.cases import Case
from switchyard.replay.scoring import ground_truth_calls

MODEL = "reference (upper bound)"
MAX_BODY = 16 * 1024 * 1024


def request_key(body: dict[str, Any]) -> str:
    """What identifies a case in a request: its messages and the names of the tools it offers."""
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    names = sorted(str((t.get("function") or {}).get("name")) for t in tools if isinstance(t, dict))
    blob = json.dumps({"messages": body.get("messages"), "tools": names}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def reference_message(case: Case) -> dict[str, Any]:
    """The assistant message a perfect model would send for `case` (tool names as offered)."""
    legal = {orig: name for name, orig in case.name_map.items()}
    calls = [(legal.get(name, name), args) for call in ground_truth_calls(case) for name, args in call.items()]
    if not calls:
        return {"role": "assistant", "content": "None of the offered functions fits this request."}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_ref_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
            for i, (name, args) in enumerate(calls)
        ],
    }


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}},
                             status=status)


@web.middleware
async def _openai_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own 404/405/413 as OpenAI error bodies, like every other error here."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _error(e.status, e.reason or "error", None, None)


def build_app(cases: list[Case]) -> web.Application:
    answers = {request_key(c.body): reference_message(c) for c in cases}

    async def chat(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "the body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "expected a chat completion request with `messages`", "messages")
        if body.get("stream"):
            return _error(400, "the reference pool does not stream", "stream", "unsupported")
        message = answers.get(request_key(body))
        if message is None:
            return _error(400, "not a case this reference pool was started with (it knows cases by their "
                               "messages and tool names)", "messages", "unknown_case")
        return completion("chatcmpl-ref-" + request_key(body)[:16], message)

    return reference_app(chat, {"cases": len(answers)})


def completion(ident: str, message: dict[str, Any]) -> web.Response:
    """One chat.completion whose answer is `message` (tool calls, or text)."""
    return web.json_response({
        "id": ident, "object": "chat.completion", "created": int(time.time()), "model": MODEL,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
    })


def reference_app(chat: Any, health_extra: dict[str, Any]) -> web.Application:
    """A reference pool's server around its chat handler: /v1/chat/completions, /v1/models and
    /health, with OpenAI's error envelope for whatever goes wrong (the single-request pool here,
    the agent-session pool in replay/multiturn/reference.py)."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "switchyard"}]})

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": MODEL, **health_extra})

    app = web.Application(client_max_size=MAX_BODY, middlewares=[_openai_errors])
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def serve(cases: list[Case], host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM."""
    web.run_app(build_app(cases), host=host, port=port, print=None, access_log=None)
