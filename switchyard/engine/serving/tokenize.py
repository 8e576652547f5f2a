"""POST /tokenize: llama-server's shape, {"content": str, "add_special": bool?} -> {"tokens": [...]},
and a chat request's {"messages": [...], "tools": [...]?} -> {"tokens": [...], "count": N}: the
prompt the chat endpoint would prefill for it (template, tools and all), which is what a
client's count_tokens needs."""

from __future__ import annotations

from typing import Any

from switchyard.engine.chat.tokenizer import ChatTokenizer
from switchyard.engine.errors import RequestError
from switchyard.engine.serving.protocol import chat_messages, tools_of


def tokenize(tok: ChatTokenizer, body: dict[str, Any]) -> dict[str, Any]:
    has_content, has_messages = "content" in body, "messages" in body
    if has_content == has_messages:
        raise RequestError("send either 'content' (a string) or 'messages' (a chat request)",
                           "content" if has_content else "messages")
    if has_content:
        content, add_special = body["content"], body.get("add_special", False)
        if not isinstance(content, str):
            raise RequestError("'content' must be a string", "content")
        if not isinstance(add_special, bool):
            raise RequestError("'add_special' must be a boolean", "add_special")
        return {"tokens": tok.encode(content, add_special=add_special)}
    messages, tools = chat_messages(body), tools_of(body)
    try:
        text = tok.render(messages, tools)
    except Exception as e:  # the template's own raise_exception, or a message it cannot take
        raise RequestError(f"the chat template could not render these messages: {e}", "messages") from None
    ids = tok.encode(text)
    return {"tokens": ids, "count": len(ids)}
