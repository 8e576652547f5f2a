"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) as a dialect of the edge.

parse: a Messages body -> the normalised Chat Completions body (`Parsed.chat`); the client's body
stays in `Parsed.native` for a pool that serves /messages itself. The way back: answers and
errors in messages_render.py, the stream translator in messages_stream.py.

Choices made where the two APIs differ (docs/agents.md says them to users):
- Claude Code's `x-anthropic-billing-header: ...` system block changes on every run: it is
  billing metadata, not an instruction, so it is left out of `chat` (no prefix key, feature or
  KV prefix cache sees it); `native` keeps it.
- A user turn's `tool_result` blocks become `tool` messages first, then its text (chat wants the
  tool answers right after the assistant's calls). `is_error` prefixes the content with "Error: ".
- `thinking` / `redacted_thinking` blocks in past assistant turns are dropped (no chat upstream
  can take their signatures); `thinking`, `context_management`, `output_config`,
  `service_tier`, `container`, `mcp_servers` are accepted and ignored.
- Server tools (any `type` but "custom": web_search_..., bash_..., text_editor_...,
  code_execution_...) are dropped and named in `Parsed.dropped`.
Every walk here is flat (messages -> blocks -> a tool_result's blocks): nothing recurses on the
client's depth, and the edge has capped the body's size and nesting already.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from switchyard.api.dialect import Parsed
from switchyard.api.messages_render import error_body, error_event, render, status
from switchyard.api.messages_stream import MessagesStream
from switchyard.errors import BadRequest

BILLING_PREFIX = "x-anthropic-billing-header:"
IGNORED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
SESSION_HEADER = "x-claude-code-session-id"


# --- parse -------------------------------------------------------------------------------------

def _bad(message: str) -> BadRequest:
    return BadRequest(message)


def _text_of_blocks(blocks: list[Any], where: str, tool_result: bool = False) -> list[str]:
    """The texts of a list of text blocks (a system prompt, a tool_result's content)."""
    out = []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict):
            raise _bad(f"{where}.{j}: Input should be an object")
        t = b.get("type")
        if t == "text":
            text = b.get("text")
            if not isinstance(text, str):
                raise _bad(f"{where}.{j}.text: Field required")
            out.append(text)
        elif t == "tool_reference" and tool_result and isinstance(b.get("tool_name"), str):
            # Claude Code's ToolSearch answers with these (advanced tool use): Anthropic then loads
            # the deferred tool. A chat upstream has every tool already; the model reads the name.
            out.append(f"Tool loaded: {b['tool_name']}")
        else:
            raise _unsupported(t, f"{where}.{j}")
    return out


def _unsupported(t: Any, where: str) -> BadRequest:
    if not isinstance(t, str):
        return _bad(f"{where}.type: Field required")
    return _bad(f"{where}: content blocks of type '{t}' are not supported by this gateway "
                f"(its upstreams take text, tool_use and tool_result)")


def _system(system: Any) -> list[str]:
    """The system prompt's texts, less the billing header block."""
    if system is None:
        return []
    if isinstance(system, str):
        return [system] if system else []
    if not isinstance(system, list):
        raise _bad("system: Input should be a valid string or a list of text blocks")
    return [t for t in _text_of_blocks(system, "system") if not t.startswith(BILLING_PREFIX)]


def _joined(texts: list[str]) -> str:
    return texts[0] if len(texts) == 1 else "\n\n".join(texts)


def _tool_result(b: dict, where: str) -> dict:
    tid = b.get("tool_use_id")
    if not isinstance(tid, str) or not tid:
        raise _bad(f"{where}.tool_use_id: Field required")
    c = b.get("content")
    if c is None:
        text = ""
    elif isinstance(c, str):
        text = c
    elif isinstance(c, list):
        text = _joined(_text_of_blocks(c, f"{where}.content", tool_result=True)) if c else ""
    else:
        raise _bad(f"{where}.content: Input should be a valid string or a list of blocks")
    if b.get("is_error") is True:
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": tid, "content": text}


def _tool_call(b: dict, where: str) -> dict:
    tid, name, args = b.get("id"), b.get("name"), b.get("input")
    if not isinstance(tid, str) or not tid:
        raise _bad(f"{where}.id: Field required")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.name: Field required")
    if not isinstance(args, dict):
        raise _bad(f"{where}.input: Input should be a valid dictionary")
    return {"id": tid, "type": "function", "function": {"name": name, "arguments": orjson.dumps(args).decode()}}


def _messages(msgs: Any) -> list[dict]:
    if msgs is None:
        raise _bad("messages: Field required")
    if not isinstance(msgs, list):
        raise _bad("messages: Input should be a valid list")
    out: list[dict] = []
    for i, m in enumerate(msgs):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise _bad(f"{where}: Input should be an object")
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant", "system"):
            raise _bad(f"{where}.role: Input should be 'user' or 'assistant'")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise _bad(f"{where}.content: Field required" if content is None
                       else f"{where}.content: Input should be a valid string or a list of blocks")
        if role == "system":  # Claude Code sends one after the user's turn: an instruction like the rest
            out.append({"role": "system", "content": _joined(_text_of_blocks(content, f"{where}.content"))})
            continue
        texts: list[str] = []
        calls: list[dict] = []
        results: list[dict] = []
        for j, b in enumerate(content):
            bw = f"{where}.content.{j}"
            if not isinstance(b, dict):
                raise _bad(f"{bw}: Input should be an object")
            t = b.get("type")
            if t == "text":
                text = b.get("text")
                if not isinstance(text, str):
                    raise _bad(f"{bw}.text: Field required")
                texts.append(text)
            elif t == "tool_use" and role == "assistant":
                calls.append(_tool_call(b, bw))
            elif t == "tool_result" and role == "user":
                results.append(_tool_result(b, bw))
            elif isinstance(t, str) and t in IGNORED_BLOCKS and role == "assistant":
                continue
            else:
                raise _unsupported(t, bw)
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": _joined(texts) if texts else None}
            if calls:
                msg["tool_calls"] = calls
            elif not texts:
                msg["content"] = ""
            out.append(msg)
        else:
            out.extend(results)  # a tool's answer follows the assistant's call at once, in chat
            if texts or not results:
                out.append({"role": "user", "content": _joined(texts) if texts else ""})
    return out


def _tools(tools: Any, dropped: list[str]) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("tools: Input should be a valid list")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise _bad(f"tools.{i}: Input should be an object")
        name, kind = t.get("name"), t.get("type")
        if kind is not None and kind != "custom":  # a server tool: Anthropic runs it; no upstream of ours can
            dropped.append(name if isinstance(name, str) and name else str(kind))
            continue
        if not isinstance(name, str) or not name:
            raise _bad(f"tools.{i}.name: Field required")
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise _bad(f"tools.{i}.custom.input_schema: Field required")
        fn: dict[str, Any] = {"name": name, "parameters": schema}
        desc = t.get("description")
        if isinstance(desc, str) and desc:
            fn["description"] = desc
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(tc: Any, chat: dict, dropped: list[str]) -> None:
    if tc is None:
        return
    if not isinstance(tc, dict):
        raise _bad("tool_choice: Input should be an object")
    kind = tc.get("type")
    if kind == "tool":
        name = tc.get("name")
        if not isinstance(name, str) or not name:
            raise _bad("tool_choice.tool.name: Field required")
        if name in dropped:
            raise _bad(f"tool_choice: '{name}' is a server tool, which this gateway cannot run")
        choice: Any = {"type": "function", "function": {"name": name}}
    elif kind in ("auto", "any", "none"):
        choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        raise _bad("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
    if "tools" not in chat:  # no tools left (none sent, or all were server tools): nothing to choose
        if kind in ("any", "tool"):
            raise _bad("tool_choice: a tool is required but the request has no tools this gateway can run")
        return
    chat["tool_choice"] = choice
    if tc.get("disable_parallel_tool_use") is True and kind != "none":
        chat["parallel_tool_calls"] = False


def _number(body: dict, key: str, chat: dict, integer: bool = False) -> None:
    v = body.get(key)
    if v is None:
        return
    ok = isinstance(v, int) if integer else isinstance(v, int | float)
    if not ok or isinstance(v, bool):
        raise _bad(f"{key}: Input should be a valid {'integer' if integer else 'number'}")
    chat[key] = v


def _metadata(md: Any, chat: dict) -> str | None:
    """metadata.user_id: Claude Code's is a JSON string carrying its session id (the hint);
    anyone else's is a plain end-user id (chat's `user`)."""
    if md is None:
        return None
    if not isinstance(md, dict):
        raise _bad("metadata: Input should be an object")
    uid = md.get("user_id")
    if uid is None:
        return None
    if not isinstance(uid, str):
        raise _bad("metadata.user_id: Input should be a valid string")
    if uid.startswith("{"):
        try:
            obj = orjson.loads(uid)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            sid = obj.get("session_id")
            return sid if isinstance(sid, str) and sid else None
    if uid:
        chat["user"] = uid
    return None


def _parse(body: Any, headers: Mapping[str, str], require_max_tokens: bool) -> Parsed:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise _bad("model: Field required")
    if not isinstance(model, str) or not model:
        raise _bad("model: Input should be a valid string")
    chat: dict[str, Any] = {"model": model}
    mt = body.get("max_tokens")
    if mt is None:
        if require_max_tokens:
            raise _bad("max_tokens: Field required")
    elif not isinstance(mt, int) or isinstance(mt, bool):
        raise _bad("max_tokens: Input should be a valid integer")
    elif mt < 1:
        raise _bad("max_tokens: Input should be greater than or equal to 1")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream: Input should be a valid boolean")
    stream = stream is True
    system = _system(body.get("system"))
    messages = _messages(body.get("messages"))
    if not messages and require_max_tokens:
        raise _bad("messages: at least one message is required")
    chat["messages"] = ([{"role": "system", "content": _joined(system)}] if system else []) + messages
    if mt is not None:
        chat["max_tokens"] = mt
    dropped: list[str] = []
    tools = _tools(body.get("tools"), dropped)
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), chat, dropped)
    for key in ("temperature", "top_p"):
        _number(body, key, chat)
    _number(body, "top_k", chat, integer=True)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _bad("stop_sequences: Input should be a valid list of strings")
        if stops:
            chat["stop"] = stops
    hint = _metadata(body.get("metadata"), chat)
    if hint is None:
        h = headers.get(SESSION_HEADER)
        hint = h if h else None
    if stream:
        # No stream_options here: dispatch asks for the usage chunk (message_delta's counts) unless
        # the pool's server refuses stream_options (stream_usage: false; then the counts are estimated).
        chat["stream"] = True
    return Parsed("messages", chat, body, stream, hint, dropped)


def count_tokens_input(body: Any, headers: Mapping[str, str] | None = None) -> Parsed:
    """A /v1/messages/count_tokens body (model, messages, system, tools; no max_tokens) ->
    the normalised request whose prompt is to be counted: `.chat["messages"]` and
    `.chat.get("tools")` for a tokenizer that applies the chat template (vLLM's /tokenize),
    `count_text(parsed.chat)` for one that takes plain text (llama-server's /tokenize)."""
    return _parse(body, headers or {}, require_max_tokens=False)


def count_text(chat: dict) -> str:
    """The text of a normalised request, for a tokenizer that counts plain text: each message's
    content and tool calls, then the tools' definitions (what a chat template puts in the prompt,
    less the template's own few tokens per message)."""
    parts = []
    for m in chat.get("messages", ()):
        c = m.get("content")
        if isinstance(c, str) and c:
            parts.append(c)
        for tc in m.get("tool_calls") or ():
            fn = tc["function"]
            parts.append(f'{fn["name"]} {fn["arguments"]}')
    for t in chat.get("tools") or ():
        parts.append(orjson.dumps(t["function"]).decode())
    return "\n".join(parts)


def estimate_tokens(chat: dict) -> int:
    """A stated estimate where no tokenizer answers: 4 characters a token, plus 4 a message."""
    return len(count_text(chat)) // 4 + 4 * len(chat.get("messages", ())) + 1


def count_tokens_body(n: int) -> bytes:
    return orjson.dumps({"input_tokens": n})


# --- the dialect -------------------------------------------------------------------------------

class MessagesDialect:
    __slots__ = ()
    api = "messages"
    native_path = "/messages"

    def parse(self, body: Any, headers: Mapping[str, str]) -> Parsed:
        return _parse(body, headers, require_max_tokens=True)

    def render(self, chat_answer: dict, parsed: Parsed) -> dict:
        return render(chat_answer, parsed)

    def translator(self, parsed: Parsed) -> MessagesStream:
        return MessagesStream(parsed)

    def error_body(self, status: int, kind: str, message: str, param: str | None, code: Any) -> bytes:
        return error_body(status, kind, message, param, code)

    def status(self, status_code: int, kind: str, code: str | None) -> int:
        return status(status_code, kind, code)

    def native_stream_error(self, message: str) -> bytes:
        """A stream passed through from a pool that serves Messages itself, failing mid-way:
        Anthropic's own error event (the SDK and Claude Code raise on it)."""
        return error_event("api_error", message)


MESSAGES = MessagesDialect()
