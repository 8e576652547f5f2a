"""A chat reply's text, as it grows, split into content and tool calls in OpenAI's delta form.

Calls are Hermes style (`<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`, the
form structured.py's grammar enforces). A call streams as OpenAI streams one: a first delta with
its index, id, type and name, then fragments of ARGS as they are generated. The non-streamed
reply is this same parser fed the whole text, so the streamed fragments add up to it exactly.
Whitespace around calls is not content, and text that could still become the opening tag is
held back until it cannot.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from switchyard.engine.chat.structured import CLOSE, OPEN

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
Delta = dict[str, Any]


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""

    def message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ToolCallStream:
    """feed() each new piece of text, then finish(); each returns the deltas to send.
    `tools` False: everything is content, passed through as it comes."""

    tools: bool
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    _state: str = "text"  # text | head | args | tail
    _buf: str = ""  # received, not yet consumed
    _held_ws: str = ""  # trailing whitespace of the content: sent once more text follows it
    _depth: int = 0
    _in_str: bool = False
    _esc: bool = False

    def feed(self, text: str) -> list[Delta]:
        if not self.tools:
            if not text:
                return []
            self.content += text
            return [{"content": text}]
        self._buf += text
        out: list[Delta] = []
        while (step := self._step()) is not None:
            out.extend(step)
        return out

    def finish(self) -> list[Delta]:
        """End of reply: what is still held back goes out (a call cut short stays as it is)."""
        if not self.tools or self._state not in ("text", "head"):
            return []
        # Text that only looked like the start of the tag, or a call cut before its name.
        pending = (OPEN if self._state == "head" else "") + self._buf
        self._buf, self._state = "", "text"
        return self._content(pending) if pending.strip() else []

    def _step(self) -> list[Delta] | None:
        """Consume what the current state can of the buffer; None when it must wait for more."""
        if self._state == "text":
            return self._text()
        if self._state == "head":
            return self._head()
        if self._state == "args":
            return self._args()
        return self._tail()

    def _content(self, text: str) -> list[Delta]:
        body = text.rstrip()
        if not body:
            self._held_ws += text
            return []
        piece = self._held_ws + body
        self._held_ws = text[len(body):]
        self.content += piece
        return [{"content": piece}]

    def _text(self) -> list[Delta] | None:
        j = self._buf.find(OPEN)
        if j >= 0:
            before, self._buf = self._buf[:j], self._buf[j + len(OPEN):]
            out = self._content(before) if before.strip() else []
            self._held_ws, self._state = "", "head"
            return out
        keep = next((k for k in range(min(len(OPEN) - 1, len(self._buf)), 0, -1) if self._buf.endswith(OPEN[:k])), 0)
        emit = self._buf[:len(self._buf) - keep]
        if not emit:
            return None
        self._buf = self._buf[len(emit):]
        return self._content(emit)

    def _head(self) -> list[Delta] | None:
        m = _HEAD.match(self._buf)
        if m is None or m.end() == len(self._buf):
            return None  # the name, or the end of the space before ARGS, is not there yet
        call = ToolCall(f"call_{uuid.uuid4().hex[:24]}", json.loads(m.group(1)))
        self.calls.append(call)
        self._buf = self._buf[m.end():]
        self._state, self._depth, self._in_str, self._esc = "args", 0, False, False
        return [{"tool_calls": [{"index": len(self.calls) - 1, "id": call.id, "type": "function",
                                 "function": {"name": call.name, "arguments": ""}}]}]

    def _args(self) -> list[Delta] | None:
        """ARGS up to the bracket that closes it (quotes and escapes tracked)."""
        if not self._buf:
            return None
        end = len(self._buf)
        for i, ch in enumerate(self._buf):
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    end = i + 1
                    self._state = "tail"
                    break
        piece, self._buf = self._buf[:end], self._buf[end:]
        self.calls[-1].arguments += piece
        return [{"tool_calls": [{"index": len(self.calls) - 1, "function": {"arguments": piece}}]}]

    def _tail(self) -> list[Delta] | None:
        j = self._buf.find(CLOSE)
        if j < 0:
            return None
        self._buf, self._state = self._buf[j + len(CLOSE):], "text"
        return []
