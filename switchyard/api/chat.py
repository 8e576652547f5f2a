"""The OpenAI Chat Completions and Completions dialects: the hot path, so they do nothing.

The client's body IS the normalised request (parse is today's validate and no copy), the
upstream's answer IS the client's (no render, no translator: bytes relayed untouched), and
errors are OpenAI's envelope.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from switchyard.api.dialect import Parsed
from switchyard.api.errors import error_body
from switchyard.gateway.requests import validate


class OpenAIDialect:
    __slots__ = ("api", "native_path")
    # No optional hooks (api/dialect.py): class attributes, so the proxy's getattr finds None at once.
    prepare = None
    keep = None
    native_stream_error = None

    def __init__(self, api: str, native_path: str) -> None:
        self.api = api
        self.native_path = native_path

    def parse(self, body: Any, headers: Mapping[str, str]) -> Parsed:
        body = validate(body, self.api)
        return Parsed(self.api, body, body, body.get("stream") is True)

    def render(self, chat_answer: dict, parsed: Parsed) -> dict:
        return chat_answer

    def translator(self, parsed: Parsed) -> None:
        return None

    def error_body(self, status: int, kind: str, message: str, param: str | None, code: str | None) -> bytes:
        return error_body(message, kind, param, code)


CHAT = OpenAIDialect("chat", "/chat/completions")
COMPLETIONS = OpenAIDialect("completions", "/completions")
