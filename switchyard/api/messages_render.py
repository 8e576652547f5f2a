"""Chat Completions -> Anthropic Messages: answers and errors (messages.py parses; the stream
translator, messages_stream.py, builds its message from the helpers here, so a stream
accumulates to exactly the message `render` makes of the same answer).

Choices made where the two APIs differ:
- Ids: msg_ and toolu_ from the upstream's ids (a stream and its render agree).
- Arguments that are not a JSON object become `input: {}` (Anthropic's input is always an
  object), with a warning in the log.
- stop_sequence only when the upstream says which stop string matched (vLLM's stop_reason).
- usage: input_tokens without the cached tokens, as Anthropic counts; cache_creation 0.
- Errors: Anthropic's types and statuses (529 where every replica is busy or none is healthy),
  and the wording Claude Code acts on for a prompt that does not fit.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

import orjson

from switchyard.api.dialect import Parsed

log = logging.getLogger("switchyard.messages")

# --- render ------------------------------------------------------------------------------------

def message_id(chat_id: Any) -> str:
    """msg_ from the upstream's id (so a stream and its non-stream render agree), else a new one."""
    if isinstance(chat_id, str) and chat_id:
        return "msg_" + chat_id.removeprefix("chatcmpl-").removeprefix("chatcmpl_")
    return "msg_" + uuid.uuid4().hex[:24]


def tool_use_id(call_id: Any) -> str:
    """toolu_ from the upstream's call id. The client sends it back as tool_use_id, which goes
    upstream as the tool message's tool_call_id: any string does there."""
    if not isinstance(call_id, str) or not call_id:
        return "toolu_" + uuid.uuid4().hex[:24]
    if call_id.startswith("toolu_"):
        return call_id
    return "toolu_" + call_id.removeprefix("call_").removeprefix("chatcmpl-tool-")


def tool_input(arguments: Any, name: str = "") -> tuple[dict, str]:
    """(input, its JSON text) for a call's arguments. Not a JSON object: {} (and a warning)."""
    if isinstance(arguments, dict):  # some servers send the object itself
        return arguments, orjson.dumps(arguments).decode()
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}, "{}"
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value, arguments
    log.warning("tool call %r: arguments are not a JSON object, sent as {}: %.200r", name, arguments)
    return {}, "{}"


def stop_of(finish: Any, matched: Any, parsed: Parsed, has_calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). Chat says only "stop" when a stop sequence ended the text;
    vLLM also says which (`stop_reason`: the string), and then so do we; otherwise end_turn."""
    if finish in ("tool_calls", "function_call") or (has_calls and finish in ("stop", None)):
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter":
        return "refusal", None
    stops = parsed.chat.get("stop") or ()
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def usage_block(usage: Any) -> dict:
    """Anthropic counts input_tokens WITHOUT the cached ones (OpenAI's prompt_tokens includes them)."""
    u = usage if isinstance(usage, dict) else {}
    prompt = _count(u.get("prompt_tokens"))
    details = u.get("prompt_tokens_details")
    cached = min(_count(details.get("cached_tokens")), prompt) if isinstance(details, dict) else 0
    return {"input_tokens": prompt - cached, "output_tokens": _count(u.get("completion_tokens")),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def _count(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _content_text(c: Any) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # content parts
        return "".join(p.get("text", "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def render(chat_answer: dict, parsed: Parsed) -> dict:
    choices = chat_answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    msg = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content: list[dict] = []
    text = _content_text(msg.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    calls = msg.get("tool_calls")
    calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    for c in calls:
        fn = c.get("function") if isinstance(c.get("function"), dict) else {}
        name = fn.get("name") if isinstance(fn.get("name"), str) else ""
        content.append({"type": "tool_use", "id": tool_use_id(c.get("id")), "name": name,
                        "input": tool_input(fn.get("arguments"), name)[0]})
    stop_reason, stop_sequence = stop_of(choice.get("finish_reason"), choice.get("stop_reason"), parsed,
                                         bool(calls))
    return {"id": message_id(chat_answer.get("id")), "type": "message", "role": "assistant",
            "model": parsed.native.get("model", ""), "content": content, "stop_reason": stop_reason,
            "stop_sequence": stop_sequence, "usage": usage_block(chat_answer.get("usage"))}


# --- errors ------------------------------------------------------------------------------------

TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
         403: "permission_error", 404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
         429: "rate_limit_error", 500: "api_error", 504: "timeout_error", 529: "overloaded_error"}
_MODEL = re.compile(r"model '(.+?)' does not exist|model (\S+) does not exist")
_TOO_LONG = re.compile(r"maximum context length is (\d+) tokens\. However, your request has (\d+) input tokens")
_TOO_MUCH = re.compile(r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens "
                       r"\((\d+) in the input, (\d+) in the completion\)")
_N_GT_M = re.compile(r"(\d+) tokens? > (\d+)")


def status(status: int, kind: str, code: str | None) -> int:
    """Anthropic's status for a gateway error: 529 (overloaded_error) where every replica is busy or
    none is healthy (OpenAI's envelope says 429 / 503); the gateway's status otherwise."""
    if code == "no_capacity" or status in (503, 529) or kind == "overloaded_error":
        return 529
    return status


def error_type(status_code: int, kind: str, code: str | None) -> str:
    if code == "context_length_exceeded":
        return "invalid_request_error"
    s = status(status_code, kind, code)
    if s in TYPES:
        return TYPES[s]
    return "invalid_request_error" if s < 500 else "api_error"


def error_message(status_code: int, message: str, param: str | None, code: str | None) -> str:
    """Anthropic's wording where its clients read it: Claude Code compacts on "prompt is too long:
    N tokens > M maximum" and lowers max_tokens on "input length and `max_tokens` exceed context
    limit: N + K > M"; an unknown model is "model: NAME"."""
    if code == "context_length_exceeded" or "maximum context length" in message:
        if m := _TOO_MUCH.search(message):
            return (f"input length and `max_tokens` exceed context limit: {m[2]} + {m[3]} > {m[1]}, "
                    "decrease input length or `max_tokens` and try again")
        if m := _TOO_LONG.search(message):
            return f"prompt is too long: {m[2]} tokens > {m[1]} maximum"
        if message.startswith("prompt is too long"):
            return message
        if m := _N_GT_M.search(message):
            return f"prompt is too long: {m[1]} tokens > {m[2]} maximum"
        return "prompt is too long: " + message
    if status_code == 404 and (param == "model" or code == "model_not_found") and (m := _MODEL.search(message)):
        return f"model: {m[1] or m[2]} (GET /v1/models lists the models served here)"
    return message


def error_body(status_code: int, kind: str, message: str, param: str | None, code: Any) -> bytes:
    code_s = code if isinstance(code, str) else None
    return orjson.dumps({"type": "error", "error": {"type": error_type(status_code, kind, code_s),
                                                    "message": error_message(status_code, message, param,
                                                                             code_s)}})


def error_event(kind: str, message: str) -> bytes:
    """An SSE `error` event: how Anthropic ends a stream that fails after it began."""
    return (b"event: error\ndata: " + orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
            + b"\n\n")
