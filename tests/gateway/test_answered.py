"""A non-streaming answer's accounting (Answered's `after`) runs once its body is handed to the
server, and however the sending ends."""

from __future__ import annotations

from typing import Any

import pytest

from switchyard.api.proxy import Answered


async def _noop_receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def test_after_runs_once_the_body_is_handed_over() -> None:
    seen: list[str] = []

    async def send(msg: dict[str, Any]) -> None:
        seen.append(msg["type"])

    resp = Answered(b'{"ok": true}', 200, {"x-switchyard-pool": "small"}, "application/json",
                    after=lambda: seen.append("after"))
    await resp({"type": "http"}, _noop_receive, send)
    assert seen == ["http.response.start", "http.response.body", "after"]
    assert (b"content-length", b"12") in resp.raw_headers


async def test_after_runs_when_the_client_is_gone_mid_answer() -> None:
    seen: list[str] = []

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.body":
            raise ConnectionResetError("the client left")
        seen.append(msg["type"])

    resp = Answered(b"{}", 200, {}, "application/json", after=lambda: seen.append("after"))
    with pytest.raises(ConnectionResetError):
        await resp({"type": "http"}, _noop_receive, send)
    assert seen == ["http.response.start", "after"]
