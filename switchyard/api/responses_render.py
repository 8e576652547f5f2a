"""The Responses dialect's output shapes, shared by the whole-answer render (responses.py) and the
stream translator (responses_stream.py): ids, the request's context, the Response object, its output
items, usage, and one server-sent event."""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

# Ids need to be unique, not secret: a stored response is visible only to the key that made it. A
# seeded PRNG makes them in ~0.2 us where uuid4 (a getrandom call each) took ~3 us.
_ids = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))  # a forked worker draws its own


def new_id(prefix: str) -> str:
    return f"{prefix}{_ids.getrandbits(128):032x}"


@dataclass(slots=True)
class ResponsesCtx:
    """What a Responses request carries past parsing: its id, what to echo, what to store."""

    id: str
    created: int
    store: bool
    echo: dict  # request fields a Response object repeats (instructions, tools, tool_choice, ...)
    input_messages: list[dict]  # this request's input as chat messages (instructions left out)
    previous: str | None = None  # previous_response_id
    history: list[dict] = field(default_factory=list)  # the chain's chat messages before this input
    root: str = ""  # the chain's first response id (this one's own when it starts a chain)


def usage_of(chat_usage: Any) -> dict | None:
    """Chat usage -> Responses usage (None when the upstream reported none)."""
    if not isinstance(chat_usage, dict):
        return None
    p = chat_usage.get("prompt_tokens") or 0
    c = chat_usage.get("completion_tokens") or 0
    details = chat_usage.get("prompt_tokens_details")
    cached = (details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    return {"input_tokens": p, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": c, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": p + c}


def response_object(ctx: ResponsesCtx, model: str, status: str, output: list[dict], usage: dict | None,
                    incomplete: bool = False, error: dict | None = None) -> dict:
    """A Response object, every field the openai SDK reads."""
    done = status in ("completed", "incomplete", "failed")
    return {
        "id": ctx.id, "object": "response", "created_at": ctx.created, "status": status, "background": False,
        "completed_at": int(time.time()) if status == "completed" else None, "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": model, "output": output if done else [], "usage": usage if done else None, **ctx.echo,
    }


def message_item(item_id: str, text: str, status: str) -> dict:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text or
            status != "in_progress" else []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


def event(kind: str, seq: int, payload: dict) -> bytes:
    payload["type"] = kind
    payload["sequence_number"] = seq
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
