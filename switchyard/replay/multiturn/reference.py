"""The reference pool for sessions: an OpenAI-compatible upstream that answers turn k of case c
with the ground truth's calls for that turn (all in one message), and, once their results are
back, with a short text that ends the turn. An upper bound, labelled so: it answers as model
"reference (upper bound)", and a session it serves alone passes BFCL's check.

It tells the case by the session id (the body's `user`, else x-session-id: `ANYTHING/CASE_ID`),
and the turn from the conversation: turn k is the k-th run of user/system messages, the step the
number of assistant messages after it. Anything else is a 400 in OpenAI's error shape.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from switchyard.replay.multiturn.data import SessionCase
from switchyard.replay.multiturn.env import Environment, parse_call
from switchyard.replay.reference import _error, completion, reference_app

TURN_DONE = "Done."


def position(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(turn index, step index within it) of the request's last message."""
    turn, step, in_user = -1, 0, False
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        if role in ("user", "system", "developer"):
            if not in_user:
                turn, step, in_user = turn + 1, 0, True
        else:
            in_user = False
            if role == "assistant":
                step += 1
    return turn, step


def case_of(session_id: str | None, cases: dict[str, SessionCase]) -> SessionCase | None:
    if not session_id:
        return None
    return cases.get(session_id.rpartition("/")[2])


def answer(case: SessionCase, turn: int, step: int, env: Environment) -> dict[str, Any]:
    truth = case.ground_truth[turn]
    if step > 0 or not truth:
        return {"role": "assistant", "content": TURN_DONE}
    calls = [parse_call(c) for c in truth]
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_ref_{turn}_{i}", "type": "function",
         "function": {"name": c.name, "arguments": json.dumps(env.named_args(c), ensure_ascii=False)}}
        for i, c in enumerate(calls)]}


def build_app(cases: list[SessionCase]) -> web.Application:
    by_id = {c.id: c for c in cases}
    envs: dict[str, Environment] = {}  # for the methods' signatures only (positional ground truth)

    async def chat(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "the body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "expected a chat completion request with `messages`", "messages")
        if body.get("stream"):
            return _error(400, "the reference pool does not stream", "stream", "unsupported")
        sid = body.get("user") if isinstance(body.get("user"), str) else request.headers.get("x-session-id")
        case = case_of(sid, by_id)
        if case is None:
            return _error(400, "no known case in the session id (`user` or x-session-id: PREFIX/CASE_ID)",
                          "user", "unknown_case")
        turn, step = position(body["messages"])
        if not 0 <= turn < len(case.ground_truth):
            return _error(400, f"{case.id} has {len(case.ground_truth)} turns; this conversation is at turn {turn}",
                          "messages", "unknown_turn")
        env = envs.get(case.id)
        if env is None:
            env = envs[case.id] = Environment(case.involved_classes, {}, False)
        message = answer(case, turn, step, env)
        return completion(f"chatcmpl-ref-{case.id}-{turn}-{step}", message)

    return reference_app(chat, {"sessions": len(by_id)})


def serve(cases: list[SessionCase], host: str, port: int) -> None:
    web.run_app(build_app(cases), host=host, port=port, print=None, access_log=None)
