"""Relay an upstream SSE stream to the client chunk by chunk, as bytes arrive (never re-parsed).

A pure ASGI response: it watches for the client leaving while it waits on the upstream,
so a disconnect closes the upstream connection at once instead of at the next chunk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from switchyard.api.errors import sse_error_event

log = logging.getLogger("switchyard.relay")

# The scope's key for our server's connection (api/server.py), whose `on_lost` a waiting request sets.
CONN_KEY = "switchyard.connection"


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


class StreamRelay(Response):
    # A Response subclass only so that FastAPI hands it to the server as is.

    def __init__(
        self,
        upstream: Any,  # an aiohttp.ClientResponse, or what stands in for one (gateway/usage.UsageTap)
        first: bytes,
        status: int,
        headers: list[tuple[bytes, bytes]],
        on_done: Callable[[str, str, int], None],
        replica_name: str,
        error_event: Callable[[str], bytes] = sse_error_event,  # the client API's mid-stream error event
    ):
        self.error_event = error_event
        self.upstream = upstream
        self.first = first
        self.status = status
        self.raw_headers = headers
        self.on_done = on_done  # (outcome: ok | client_gone | upstream_failed, reason, bytes_sent)
        self.replica_name = replica_name
        self.status_code = status
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        conn = scope.get(CONN_KEY)
        if conn is not None:
            await self._relay_hooked(conn, send)
            return
        outcome, reason, sent = "client_gone", "client disconnected", 0
        disconnect = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": self.status, "headers": self.raw_headers})
            chunk = self.first
            content = self.upstream.content
            while True:
                if chunk:  # the first chunk may be held back whole (an incomplete event)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    sent += len(chunk)
                read = asyncio.ensure_future(content.readany())
                await asyncio.wait((read, disconnect), return_when=asyncio.FIRST_COMPLETED)
                if disconnect.done():  # the client left: stop reading; on_done closes the upstream
                    read.cancel()  # (a read that already finished is simply dropped)
                    return
                try:
                    chunk = read.result()
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    outcome = "upstream_failed"
                    reason = f"upstream {self.replica_name} failed mid-stream: {type(e).__name__}: {e}"
                    log.warning(reason)
                    # A clean error event, then the end: the client raises instead of hanging.
                    await send({"type": "http.response.body", "body": self.error_event(reason), "more_body": False})
                    return
                if not chunk:
                    break
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            outcome, reason = "ok", ""
        except OSError:
            outcome = "client_gone" if outcome != "upstream_failed" else outcome
        finally:
            disconnect.cancel()
            self.on_done(outcome, reason, sent)

    async def _relay_hooked(self, conn: Any, send: Send) -> None:
        """Under our server (api/server.py): its connection cancels this task if the client goes,
        so each chunk is one read and one send, with no task and no asyncio.wait per chunk."""
        outcome, reason, sent = "client_gone", "client disconnected", 0
        me = asyncio.current_task()
        left: list[bool] = []

        def lost() -> None:
            left.append(True)
            if me is not None:
                me.cancel()

        conn.on_lost = lost
        try:
            await send({"type": "http.response.start", "status": self.status, "headers": self.raw_headers})
            chunk = self.first
            readany = self.upstream.content.readany
            while True:
                if chunk:  # the first chunk may be held back whole (an incomplete event)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    sent += len(chunk)
                try:
                    chunk = await readany()
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    outcome = "upstream_failed"
                    reason = f"upstream {self.replica_name} failed mid-stream: {type(e).__name__}: {e}"
                    log.warning(reason)
                    # A clean error event, then the end: the client raises instead of hanging.
                    await send({"type": "http.response.body", "body": self.error_event(reason), "more_body": False})
                    return
                if not chunk:
                    break
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            outcome, reason = "ok", ""
        except asyncio.CancelledError:
            if not left:
                raise
            if me is not None:
                me.uncancel()  # the client left: stop reading; on_done closes the upstream
        except OSError:
            outcome = "client_gone" if outcome != "upstream_failed" else outcome
        finally:
            conn.on_lost = None
            self.on_done(outcome, reason, sent)
