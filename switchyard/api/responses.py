"""OpenAI's Responses API (`POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`) as a dialect:
parsed into a Chat Completions body for routing and for chat-only upstreams, rendered back as a
Response object or its event stream.

What is translated: `instructions` (a system message), `input` (a string, or items: `message`
with input_text/output_text parts and roles user/assistant/system/developer, `function_call`,
`function_call_output`), flat `function` tools, `tool_choice` (auto, none, required, a named
function, allowed_tools), `parallel_tool_calls`, `text.format` (json_object, json_schema ->
response_format), `max_output_tokens`, `temperature`, `top_p`, `stop`, `metadata`, `user`.
Accepted and ignored: `reasoning`, `include`, `client_metadata`, `truncation`, `service_tier`,
`prompt_cache_retention`, `safety_identifier`, `reasoning` items in `input` (Codex sends its own
back); `prompt_cache_key` names the session. Dropped and named in x-switchyard-dropped-tools:
tools no chat upstream can run (hosted web_search, file_search, ..., Codex's `namespace`).
Refused with a 400: images, files and audio in the input, item references, stored prompts,
conversations, background mode.

`store` (default true, as OpenAI's) keeps each answer in the state store (in memory, or in Redis
for every gateway) for `previous_response_id` and GET/DELETE, visible only to the API key that
made it. A `previous_response_id` chain is a session: its root id is the session hint.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from switchyard import errors
from switchyard.api.dialect import Parsed
from switchyard.api.errors import error_body
from switchyard.api.responses_render import (
    ResponsesCtx,
    call_item,
    event,
    message_item,
    new_id,
    response_object,
    usage_of,
)
from switchyard.api.responses_stream import ResponsesStream
from switchyard.state.base import RESPONSE_TTL, StateStore

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
UNSUPPORTED_PARTS = frozenset({"input_image", "input_file", "input_audio", "image_url", "file"})
# Items of hosted tools' calls (and their outputs) a client may send back from an earlier OpenAI
# turn: nothing a chat upstream can use, and dropping them loses no instruction.
SKIPPED_ITEMS = frozenset({
    "reasoning", "web_search_call", "file_search_call", "computer_call", "computer_call_output",
    "code_interpreter_call", "image_generation_call", "local_shell_call", "local_shell_call_output",
    "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_call",
    "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "custom_tool_call",
    "custom_tool_call_output", "tool_search_call", "compaction", "compaction_trigger",
})
REFUSED = {
    "conversation": "conversations are not supported here; send previous_response_id or the whole input",
    "prompt": "stored prompts (prompt) are not supported here; send instructions and input",
}


def _bad(message: str, param: str | None = None) -> errors.BadRequest:
    return errors.BadRequest(message, param)


def _text_of(content: Any, where: str) -> str:
    """Message content (a string or parts) -> its text; non-text parts are a 400."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or an array of content parts", where)
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):  # type: ignore[union-attr]
            texts.append(part["text"])  # type: ignore[index]
        elif kind == "refusal" and isinstance(part.get("refusal"), str):  # type: ignore[union-attr]
            texts.append(part["refusal"])  # type: ignore[index]
        elif kind in UNSUPPORTED_PARTS:
            raise _bad(f"{where}[{j}]: {kind} parts are not supported by this gateway (its upstreams take "
                       "text only); send the content as input_text", f"{where}[{j}].type")
        else:
            raise _bad(f"{where}[{j}]: unsupported content part type {kind!r}; use input_text", f"{where}[{j}].type")
    # Several text parts read as one text (vLLM's chat templates join them with a newline too).
    return texts[0] if len(texts) == 1 else "\n".join(texts)


def input_messages(items: Any, where: str = "input") -> list[dict]:
    """Responses input items (or a Response's output items) -> chat messages, in order; function
    calls that follow an assistant turn join it, as chat wants them."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise _bad(f"'{where}' must be a string or an array of input items", where)
    out: list[dict] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{at} must be an object", at)
        kind = item.get("type")
        if kind == "message" or (kind is None and "role" in item):
            role = ROLES.get(item.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise _bad(f"{at}.role must be one of user, assistant, system, developer; got {item.get('role')!r}",
                           f"{at}.role")
            out.append({"role": role, "content": _text_of(item.get("content"), f"{at}.content")})
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(args, str):
                raise _bad(f"{at}: a function_call needs call_id, name and arguments (strings)", at)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # one chat turn: its text, then its calls
                last.setdefault("tool_calls", []).append(call)
                if last.get("content") == "":
                    last["content"] = None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise _bad(f"{at}.call_id is required", f"{at}.call_id")
            if isinstance(output, dict):  # a structured result some clients send: the tool message holds its JSON
                output = orjson.dumps(output).decode()
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text_of(output, f"{at}.output")})
        elif kind in SKIPPED_ITEMS:
            continue
        elif kind == "item_reference":
            raise _bad(f"{at}: item references are not supported here; send the item itself", f"{at}.type")
        else:
            raise _bad(f"{at}: unsupported input item type {kind!r}", f"{at}.type")
    return out


def chat_to_items(messages: list[dict]) -> list[dict]:
    """Chat messages (a stored chain) -> Responses input items, for a pool that takes Responses."""
    items: list[dict] = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"), "output": content or ""})
            continue
        if role == "assistant":
            if content:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": content}]})
            for tc in m.get("tool_calls") or ():
                fn = tc.get("function") or {}
                items.append({"type": "function_call", "call_id": tc.get("id"), "name": fn.get("name"),
                              "arguments": fn.get("arguments") or ""})
            continue
        items.append({"type": "message", "role": role, "content": [{"type": "input_text", "text": content or ""}]})
    return items


def _tools(tools: Any) -> tuple[list[dict], list[dict], list[str]]:
    """(chat tools, the Responses function tools kept, names of the tools dropped)."""
    if tools is None:
        return [], [], []
    if not isinstance(tools, list):
        raise _bad("'tools' must be an array", "tools")
    chat, kept, dropped = [], [], []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise _bad(f"tools[{i}] must be an object", f"tools[{i}]")
        if t.get("type") != "function":
            kind = str(t.get("type"))
            name = t.get("name")
            dropped.append(f"{kind}:{name}" if isinstance(name, str) and name else kind)
            continue
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"tools[{i}].name is required", f"tools[{i}].name")
        fn: dict[str, Any] = {"name": name}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        fn["parameters"] = t["parameters"] if isinstance(t.get("parameters"), dict) else {
            "type": "object", "properties": {}}
        if isinstance(t.get("strict"), bool):
            fn["strict"] = t["strict"]
        chat.append({"type": "function", "function": fn})
        kept.append(t)
    return chat, kept, dropped


def _tool_choice(choice: Any, chat_tools: list[dict]) -> tuple[Any, list[dict]]:
    """(the chat tool_choice, the tools left: allowed_tools narrows them)."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice, chat_tools
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "function" and isinstance(choice.get("name"), str):
            return {"type": "function", "function": {"name": choice["name"]}}, chat_tools
        if kind == "allowed_tools" and isinstance(choice.get("tools"), list):
            names = {t.get("name") for t in choice["tools"] if isinstance(t, dict)}
            mode = choice.get("mode", "auto")
            if mode not in ("auto", "required"):
                raise _bad("tool_choice.mode must be auto or required", "tool_choice.mode")
            return mode, [t for t in chat_tools if t["function"]["name"] in names]
        raise _bad(f"tool_choice {kind!r} names a hosted tool this gateway cannot run; use auto, none, required "
                   "or a function", "tool_choice")
    raise _bad("tool_choice must be auto, none, required or an object", "tool_choice")


def _response_format(text: Any) -> dict | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise _bad("'text' must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        if not isinstance(fmt.get("schema"), dict):
            raise _bad("text.format.schema must be a JSON Schema object", "text.format.schema")
        js: dict[str, Any] = {"name": fmt.get("name") if isinstance(fmt.get("name"), str) else "response",
                              "schema": fmt["schema"]}
        for k in ("strict", "description"):
            if k in fmt:
                js[k] = fmt[k]
        return {"type": "json_schema", "json_schema": js}
    raise _bad(f"text.format.type must be text, json_object or json_schema; got {kind!r}", "text.format.type")


def _number(body: dict, name: str) -> float | int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _bad(f"'{name}' must be a number", name)
    return v


class ResponsesDialect:
    api = "responses"
    native_path = "/responses"

    def __init__(self, state: StateStore | None = None, ttl: float = RESPONSE_TTL) -> None:
        self.state = state
        self.ttl = ttl

    # --- request ------------------------------------------------------------------------

    def parse(self, body: Any, headers: Mapping[str, str]) -> Parsed:
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _bad("you must provide a model parameter", "model")
        stream = body.get("stream", False)
        if stream is not None and not isinstance(stream, bool):
            raise _bad("'stream' must be a boolean", "stream")
        for k, why in REFUSED.items():
            if body.get(k) is not None:
                raise _bad(why, k)
        if body.get("background") is True:
            raise _bad("background responses are not supported here; stream instead", "background")
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise _bad("'instructions' must be a string", "instructions")
        previous = body.get("previous_response_id")
        if previous is not None and (not isinstance(previous, str) or not previous):
            raise _bad("'previous_response_id' must be a response id", "previous_response_id")
        if "input" not in body and previous is None:
            raise _bad("'input' is a required property", "input")
        inp = input_messages(body.get("input", []))
        tools, kept, dropped = _tools(body.get("tools"))
        choice, tools = _tool_choice(body.get("tool_choice"), tools)
        msgs = ([{"role": "system", "content": instructions}] if instructions else []) + inp
        if not msgs and previous is None:
            raise _bad("'input' must contain at least one item", "input")
        chat: dict[str, Any] = {"model": model, "messages": msgs}
        if stream:
            chat["stream"] = True
        if tools:
            chat["tools"] = tools
            if choice is not None:
                chat["tool_choice"] = choice
            if isinstance(body.get("parallel_tool_calls"), bool):
                chat["parallel_tool_calls"] = body["parallel_tool_calls"]
        elif choice == "none":
            chat["tool_choice"] = "none"
        fmt = _response_format(body.get("text"))
        if fmt is not None:
            chat["response_format"] = fmt
        mot = body.get("max_output_tokens")
        if mot is not None:
            if isinstance(mot, bool) or not isinstance(mot, int) or mot < 1:
                raise _bad("'max_output_tokens' must be a whole number >= 1", "max_output_tokens")
            chat["max_tokens"] = mot
        for k in ("temperature", "top_p"):
            v = _number(body, k)
            if v is not None:
                chat[k] = v
        stop = body.get("stop")
        if isinstance(stop, str | list):
            chat["stop"] = stop
        meta = body.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise _bad("'metadata' must be an object", "metadata")
        if meta:
            chat["metadata"] = meta
        user = body.get("user")
        if isinstance(user, str) and user:
            chat["user"] = user
        text_cfg = body.get("text") if isinstance(body.get("text"), dict) else {}
        echo = {
            "instructions": instructions, "max_output_tokens": mot, "max_tool_calls": None,
            "metadata": meta or {}, "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "previous_response_id": previous, "reasoning": {"effort": None, "summary": None},
            "service_tier": "default", "store": body.get("store") is not False,
            "temperature": chat.get("temperature", 1.0), "text": {"format": text_cfg.get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto", "tools": kept, "top_p": chat.get("top_p", 1.0),
            "truncation": "disabled", "user": user if isinstance(user, str) else None,
        }
        rid = new_id("resp_")
        ctx = ResponsesCtx(rid, int(time.time()), body.get("store") is not False, echo, inp, previous, root=rid)
        hint = body.get("prompt_cache_key")
        return Parsed("responses", chat, body, stream is True, hint if isinstance(hint, str) and hint else None,
                      dropped, ctx)

    async def prepare(self, parsed: Parsed, caller: str, native: bool = False) -> None:
        """previous_response_id: the chain's messages go before this input; its root is the session.
        `native`: a pool of the request's policy serves Responses itself, so an id this gateway never
        stored may be that upstream's own (it is passed on rather than refused)."""
        ctx: ResponsesCtx = parsed.ctx
        if ctx.previous is None:
            return
        raw = await self.state.get_response(caller, ctx.previous) if self.state is not None else None
        if raw is None:
            if native:
                parsed.session_hint = ctx.previous
                return
            raise errors.NotFound(f"Previous response with id '{ctx.previous}' not found.", "previous_response_id",
                                  code="previous_response_not_found")
        rec = orjson.loads(raw)
        ctx.history = rec["messages"]
        ctx.root = rec.get("root") or ctx.previous
        parsed.session_hint = ctx.root
        msgs = parsed.chat["messages"]
        n_sys = 1 if msgs and msgs[0]["role"] == "system" and parsed.native.get("instructions") else 0
        parsed.chat["messages"] = msgs[:n_sys] + ctx.history + msgs[n_sys:]
        if native:  # a pool that serves Responses itself never saw this chain: it gets the whole input
            body = {k: v for k, v in parsed.native.items() if k != "previous_response_id"}
            inp = body.get("input")
            body["input"] = chat_to_items(ctx.history) + (
                [{"role": "user", "content": inp}] if isinstance(inp, str) else list(inp or []))
            parsed.native = body

    # --- answer -------------------------------------------------------------------------

    def render(self, chat_answer: dict, parsed: Parsed) -> dict:
        ctx: ResponsesCtx = parsed.ctx
        choice = chat_answer["choices"][0]
        msg = choice.get("message") or {}
        output: list[dict] = []
        text = msg.get("content")
        if isinstance(text, str) and text:
            output.append(message_item(new_id("msg_"), text, "completed"))
        for tc in msg.get("tool_calls") or ():
            fn = tc.get("function") or {}
            output.append(call_item(new_id("fc_"), tc.get("id") or new_id("call_"), fn.get("name", ""),
                                    fn.get("arguments") or "", "completed"))
        incomplete = choice.get("finish_reason") == "length"
        return response_object(ctx, chat_answer.get("model") or parsed.chat["model"],
                               "incomplete" if incomplete else "completed", output,
                               usage_of(chat_answer.get("usage")), incomplete)

    def translator(self, parsed: Parsed) -> ResponsesStream:
        return ResponsesStream(parsed.ctx, parsed.chat["model"])

    def error_body(self, status: int, kind: str, message: str, param: str | None, code: str | None) -> bytes:
        return error_body(message, kind, param, code)

    def native_stream_error(self, message: str) -> bytes:
        """A stream passed through from a pool that serves Responses, failing mid-way: OpenAI's error
        event (its sequence number is not ours to know: the SDK and Codex read the type and message)."""
        return event("error", 0, {"code": "upstream_error", "message": message, "param": None})

    # --- store --------------------------------------------------------------------------

    async def keep(self, parsed: Parsed, caller: str, response: dict) -> None:
        ctx: ResponsesCtx = parsed.ctx
        if not ctx.store or self.state is None or response.get("status") == "failed":
            return
        messages = ctx.history + ctx.input_messages + input_messages(response.get("output") or [], "output")
        start = len(ctx.history)  # this response's own input: messages[start:end] (GET .../input_items)
        record = orjson.dumps({"root": ctx.root, "messages": messages, "input_at": [start, start + len(ctx.input_messages)],
                               "response": response})
        await self.state.put_response(caller, ctx.id, record, self.ttl)

    async def retrieve(self, caller: str, response_id: str) -> bytes | None:
        """The stored Response object (JSON), None when this caller has none of that id."""
        raw = await self.state.get_response(caller, response_id) if self.state is not None else None
        if raw is None:
            return None
        return orjson.dumps(orjson.loads(raw)["response"])

    async def input_items(self, caller: str, response_id: str) -> list[dict] | None:
        """The stored response's input as Responses items (each with an id), oldest first; None when
        this caller has none of that id. Instructions are not items, as OpenAI lists them."""
        raw = await self.state.get_response(caller, response_id) if self.state is not None else None
        if raw is None:
            return None
        rec = orjson.loads(raw)
        start, end = rec.get("input_at") or (0, 0)
        items = chat_to_items(rec["messages"][start:end])
        tag = response_id.removeprefix("resp_")
        for i, item in enumerate(items):
            prefix = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}[item["type"]]
            item["id"] = f"{prefix}{tag}{i:04d}"
            item["status"] = "completed"
        return items

    async def delete(self, caller: str, response_id: str) -> bool:
        return self.state is not None and await self.state.delete_response(caller, response_id)
