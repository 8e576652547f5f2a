"""A gateway asked to stop exits even when one of its parts will not close: the lifespan's
closing runs under one deadline, names what it left behind, and still closes the rest."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import inproc
import pytest

from switchyard.api import app as app_module
from switchyard.api.app import close_in_order


def test_a_close_that_never_ends_is_left_behind_and_the_rest_still_close(caplog: pytest.LogCaptureFixture) -> None:
    closed: list[str] = []

    async def stuck() -> None:  # shielded: it does not even end when cancelled
        await asyncio.shield(asyncio.get_running_loop().create_future())

    async def fails() -> None:
        raise RuntimeError("socket already gone")

    async def ok(name: str) -> None:
        closed.append(name)

    async def run() -> tuple[list[str], float]:
        t0 = time.monotonic()
        left = await close_in_order([("first", lambda: ok("first")), ("stuck part", stuck), ("skipped", None),
                                     ("failing part", fails), ("last", lambda: ok("last"))], 0.3)
        return left, time.monotonic() - t0

    with caplog.at_level("WARNING", logger="switchyard.api"):
        left, took = asyncio.run(run())
    assert left == ["stuck part"]
    assert closed == ["first", "last"]
    assert took < 1.0, took
    assert "closing stuck part did not finish" in caplog.text
    assert "closing failing part failed" in caplog.text and "socket already gone" in caplog.text


def test_a_gateway_whose_close_hangs_still_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real lifespan (create_app under the in-process tier): its gateway's close hangs, the
    lifespan ends within the budget and says which part it left."""
    monkeypatch.setattr(app_module, "SHUTDOWN_BUDGET_S", 0.5)
    with inproc.stack() as s:
        up = s.upstream("u")
        policy = tmp_path / "p.yaml"
        policy.write_text(f"version: 1\nname: p\npools:\n  small:\n    model: m\n    replicas: [{{url: {up.url}/v1}}]\n"
                          "routes:\n  - {name: all, pool: small}\n")
        gw = s.gateway([policy])
        assert gw.post("/v1/chat/completions", json={"model": "auto", "messages": [
            {"role": "user", "content": "hi"}]}).status_code == 200

        async def hang() -> None:
            await asyncio.shield(asyncio.get_running_loop().create_future())

        gw.app.state.gateway.aclose = hang
        t0 = time.monotonic()
        gw.stop()
        assert time.monotonic() - t0 < 3.0
        s.gateways.remove(gw)
        assert "closing gateway did not finish within the 0.5 s budget" in gw.output()
