"""The edge's one interface for every client API (Chat Completions, Completions, Responses,
Anthropic Messages): a dialect parses its API's body into the normalised request (a Chat
Completions body) and renders answers and errors back. Nothing past the edge knows which API a
client spoke: routing, limits, usage, recording and a chat-only upstream all see `Parsed.chat`.

The contract is written down for the helpers who build dialects in /work/coord/DIALECT.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class Parsed:
    api: str  # "chat" | "completions" | "responses" | "messages"
    chat: dict  # the normalised request, a Chat Completions body (a Completions body for "completions")
    native: dict  # the client's body as it came: sent as is (model rewritten) to a pool that speaks the API
    stream: bool
    session_hint: str | None = None  # a session id from the client's own fields, used after x-session-id
    dropped: list[str] = field(default_factory=list)  # tools no upstream can run: x-switchyard-dropped-tools
    ctx: Any = None  # the dialect's own per-request values (the Responses id, its stored history, ...)
    size: int | None = None  # bytes of `chat` as the client sent them, when it is the client's own body


class StreamTranslator(Protocol):
    def feed(self, data: bytes) -> bytes:
        """Upstream Chat Completions SSE bytes, split anywhere -> this API's SSE bytes (maybe b"")."""
        ...

    def close(self) -> bytes:
        """The upstream ended cleanly: the closing events (response.completed, message_stop...)."""
        ...

    def error(self, message: str) -> bytes:
        """A failure mid-stream: this API's error event (never a silent cut)."""
        ...


class Dialect(Protocol):
    api: str
    native_path: str  # where a pool that speaks this API natively takes it: "/responses", "/messages"

    def parse(self, body: Any, headers: Mapping[str, str]) -> Parsed:
        """Raises switchyard.errors.BadRequest (a 400 in this API's shape) for what it cannot take."""
        ...

    def render(self, chat_answer: dict, parsed: Parsed) -> dict:
        """A non-streaming upstream chat.completion -> this API's answer body."""
        ...

    def translator(self, parsed: Parsed) -> StreamTranslator | None:
        """None: the upstream's stream is this API's already (chat, completions): relayed untouched."""
        ...

    def error_body(self, status: int, kind: str, message: str, param: str | None, code: str | None) -> bytes:
        """The gateway's error (its status, OpenAI-style type and code) in this API's shape."""
        ...


def chat_path(api: str) -> str:
    """Where `Parsed.chat` goes upstream."""
    return "/completions" if api == "completions" else "/chat/completions"
