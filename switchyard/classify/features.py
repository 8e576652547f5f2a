"""What a request looks like to the router: one pass over the body, no model calls.

Features feed the policy's predicates and the classifiers. Every valid OpenAI message
shape is accepted: string, null or list-of-parts content, assistant tool_calls, tool
messages, legacy `function` messages.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

# Text cues come from one tokenisation of the head of the last user turn (regexes with
# alternations cost ~100 us per 4 KB; one findall plus set lookups costs a fraction of that).
TOKEN_PATTERN = r"[a-z0-9_]+"
TEXT_SCAN_CHARS = 1000  # bounded work per request, whatever the client sends
_TOKEN = re.compile(TOKEN_PATTERN)
# Words and word pairs that ask for several things at once: "both", "and also", "for each"...
_CUE_WORDS = frozenset({"both", "respectively", "simultaneously", "then", "also", "parallel"})
_CUE_PAIRS = frozenset({
    ("as", "well"), ("each", "of"), ("for", "each"), ("for", "every"), ("all", "of"),
    ("same", "time"), ("after", "that"), ("followed", "by"), ("and", "then"),
})
_CUE_FIRSTS = frozenset(a for a, _ in _CUE_PAIRS)
_ERROR_CUES = re.compile(r"\b(error|exception|traceback|failed|failure|invalid|not found|denied)\b")


def content_text(content: Any) -> str:
    """The text of a message's content, whatever its shape."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "\n".join(parts)
    return ""


@dataclass(slots=True)
class Features:
    model: str = ""
    tools: int = 0
    tool_schema_chars: int = 0
    turns: int = 0  # user messages in the conversation
    messages: int = 0
    tool_result: bool = False  # the last message is a tool result
    tool_error: bool = False  # ... and it reads like an error
    tool_calls_so_far: int = 0
    prompt_chars: int = 0
    prompt_tokens: int = 0  # estimate: chars / 4, as tiktoken averages on English
    text: str = ""  # last user turn
    tokens: list[str] = field(default_factory=list)  # TOKEN_PATTERN over text[:TEXT_SCAN_CHARS].lower()
    system_chars: int = 0
    parallel_cues: int = 0  # "both", "and also", "for each", ... in the last user turn
    headers: Mapping[str, str] = field(default_factory=dict)
    tool_params: int = 0  # parameters over all tool schemas
    enumerations: int = 0  # commas, "and", list items in the last user turn
    numbers: int = 0  # numbers in the last user turn
    questions: int = 0  # question marks in the last user turn
    user_chars: int = 0  # all user text in the conversation
    cues_done: bool = False  # tokens, parallel_cues, enumerations, numbers, questions are filled in
    tool_choice: str = ""  # "" (not given) | auto | none | required | named (one function by name)
    response_format: str = ""  # "" (not given) | text | json_object | json_schema

    def summary(self) -> dict[str, Any]:
        """The features a policy's rules read, as `/v1/route`, the preview and explain show them."""
        return {"tools": self.tools, "turns": self.turns, "messages": self.messages,
                "tool_result": self.tool_result, "tool_error": self.tool_error,
                "tool_calls_so_far": self.tool_calls_so_far, "prompt_tokens": self.prompt_tokens,
                "model": self.model, "tool_choice": self.tool_choice or None,
                "response_format": self.response_format or None}

    def numeric(self) -> list[float]:
        """The numeric part of the classifier's input, in a fixed order (see NUMERIC_NAMES)."""
        return [
            float(self.tools),
            float(self.tool_schema_chars),
            float(self.turns),
            float(self.messages),
            float(self.tool_result),
            float(self.tool_error),
            float(self.tool_calls_so_far),
            float(self.prompt_tokens),
            float(len(self.text)),
            float(self.parallel_cues),
            float(self.tool_params),
            float(self.enumerations),
            float(self.numbers),
            float(self.questions),
            float(self.user_chars),
        ]


NUMERIC_NAMES = [
    "tools",
    "tool_schema_chars",
    "turns",
    "messages",
    "tool_result",
    "tool_error",
    "tool_calls_so_far",
    "prompt_tokens",
    "text_chars",
    "parallel_cues",
    "tool_params",
    "enumerations",
    "numbers",
    "questions",
    "user_chars",
]


def _schema_chars(tools: list[Any]) -> int:
    try:
        return len(orjson.dumps(tools))
    except TypeError:
        return len(str(tools))


def _param_count(tools: list[Any]) -> int:
    n = 0
    for t in tools:
        if not isinstance(t, Mapping):
            continue
        fn = t.get("function", t)  # tools wrap the function; legacy `functions` are bare
        params = fn.get("parameters") if isinstance(fn, Mapping) else None
        props = params.get("properties") if isinstance(params, Mapping) else None
        if isinstance(props, Mapping):
            n += len(props)
    return n


def extract(body: Mapping[str, Any], headers: Mapping[str, str] | None = None, *,
            text_cues: bool = True) -> Features:
    """Features of a chat or completions request body (already validated as a mapping).

    `text_cues=False` leaves the tokenised text cues for later: the rules never read them, so
    the gateway skips them unless a classifier asks (`fill_text_cues`, done by the vectorizer).
    """
    f = Features(headers=headers or {})
    model = body.get("model")
    f.model = model if isinstance(model, str) else ""
    tools = body.get("tools")
    if not isinstance(tools, list):
        tools = body.get("functions")  # legacy function calling
    if isinstance(tools, list):
        f.tools = len(tools)
        f.tool_schema_chars = _schema_chars(tools)
        f.tool_params = _param_count(tools)
    messages = body.get("messages")
    if isinstance(messages, list):
        f.messages = len(messages)
        chars = 0
        last_user = ""
        for m in messages:
            if not isinstance(m, Mapping):
                continue
            role = m.get("role")
            text = content_text(m.get("content"))
            chars += len(text)
            if role == "user":
                f.turns += 1
                f.user_chars += len(text)
                last_user = text
            elif role == "system" or role == "developer":
                f.system_chars += len(text)
            elif role == "assistant":
                calls = m.get("tool_calls")
                if isinstance(calls, list):
                    f.tool_calls_so_far += len(calls)
                    for c in calls:
                        fn = c.get("function") if isinstance(c, Mapping) else None
                        if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                            chars += len(fn["arguments"])
                elif m.get("function_call"):
                    f.tool_calls_so_far += 1
        last = messages[-1] if messages else None
        if isinstance(last, Mapping) and last.get("role") in ("tool", "function"):
            f.tool_result = True
            f.tool_error = bool(_ERROR_CUES.search(content_text(last.get("content"))[:2000].lower()))
        f.text = last_user
        f.prompt_chars = chars + f.tool_schema_chars
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            f.text = prompt
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            f.text = "\n".join(prompt)
        f.turns = 1 if f.text else 0
        f.prompt_chars = len(f.text)
        f.user_chars = len(f.text)
    f.prompt_tokens = (f.prompt_chars + 3) // 4
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        f.tool_choice = choice
    elif isinstance(choice, Mapping):
        f.tool_choice = "named"
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping) and isinstance(fmt.get("type"), str):
        f.response_format = fmt["type"]
    if text_cues:
        fill_text_cues(f)
    return f


def fill_text_cues(f: Features) -> None:
    if f.cues_done:
        return
    f.cues_done = True
    head = f.text[:TEXT_SCAN_CHARS].lower()
    tokens = _TOKEN.findall(head)
    f.tokens = tokens
    cues = numbers = 0
    prev = ""
    for t in tokens:
        if t in _CUE_WORDS or (prev in _CUE_FIRSTS and (prev, t) in _CUE_PAIRS):
            cues += 1
        if t[0].isdigit():
            numbers += 1
        prev = t
    f.parallel_cues = cues
    f.numbers = numbers
    # Enumerations: "a, b and c", "x; y", bullet or numbered list lines.
    f.enumerations = head.count(",") + head.count(";") + head.count(" and ") + head.count("\n- ") + head.count(
        "\n* "
    )
    f.questions = head.count("?")
