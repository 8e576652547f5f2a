"""A misbehaving streaming upstream for the edge-hardening tests: a raw HTTP/1.1 server process.

    python tests/edge_upstream.py --port 9101
    POST /_control {"mode": "endless_event", ...}     GET /_state -> {"served": N, "closed_early": N}

Modes (what a POST to any other path gets):
- `json`: `body` with a Content-Length (a non-stream answer, e.g. one built to stall a parser).
- `stream`: `events` (a list of SSE event strings), each flushed, `delay_ms` apart; `framing`
  says how the body ends: `close` (no Content-Length, no chunked: the connection's end is the
  body's end, so a cut looks like a clean end), or `chunked`. `cut_after` events: stop there
  and close (a stream that dies midway).
- `endless_event`: one SSE event that never ends: `total_mb` of content sent as fast as the
  socket takes it, in 64 KB writes, then the connection closes.

Raw sockets because a framework would add the framing (and the final chunk) these cases lack.
"""

from __future__ import annotations

import argparse
import asyncio

import orjson

STATE: dict = {"served": 0, "closed_early": 0, "cfg": {"mode": "json", "body": '{"ok":true}'}}


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
    body = await reader.readexactly(length) if length else b""
    return method, path, body


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} OK"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _json(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
    writer.write(_head(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]) + body)
    await writer.drain()


async def _stream(writer: asyncio.StreamWriter, cfg: dict) -> None:
    chunked = cfg.get("framing") == "chunked"
    headers = [("Content-Type", "text/event-stream")]
    headers.append(("Transfer-Encoding", "chunked") if chunked else ("Connection", "close"))
    writer.write(_head(200, headers))
    events = cfg.get("events") or []
    cut = cfg.get("cut_after")
    for i, ev in enumerate(events):
        if cut is not None and i >= cut:
            STATE["closed_early"] += 1
            return  # the caller closes the socket: no final chunk, no [DONE]
        data = ev.encode()
        writer.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        await writer.drain()
        if cfg.get("delay_ms"):
            await asyncio.sleep(cfg["delay_ms"] / 1000)
    if chunked:
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _endless(writer: asyncio.StreamWriter, cfg: dict) -> None:
    writer.write(_head(200, [("Content-Type", "text/event-stream"), ("Connection", "close")]))
    writer.write(b'data: {"choices":[{"index":0,"delta":{"content":"')
    block = b"x" * 65536
    for _ in range(int(cfg.get("total_mb", 128) * 16)):
        writer.write(block)
        await writer.drain()  # fails once the gateway hangs up: that ends this answer
        if cfg.get("delay_ms"):
            await asyncio.sleep(cfg["delay_ms"] / 1000)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            req = await _read_request(reader)
            if req is None:
                return
            method, path, body = req
            if path == "/_control":
                STATE["cfg"] = orjson.loads(body)
                await _json(writer, 200, b'{"ok":true}')
                continue
            if path == "/_state":
                await _json(writer, 200, orjson.dumps({k: v for k, v in STATE.items() if k != "cfg"}))
                continue
            if method == "GET":  # /health, /metrics
                await _json(writer, 200, b'{"status":"ok"}')
                continue
            STATE["served"] += 1
            cfg = STATE["cfg"]
            mode = cfg.get("mode", "json")
            if mode == "json":
                await _json(writer, cfg.get("status", 200), cfg.get("body", "{}").encode())
                continue
            if mode == "stream":
                await _stream(writer, cfg)
                if cfg.get("framing") == "chunked" and cfg.get("cut_after") is None:
                    continue
            else:
                await _endless(writer, cfg)
            return  # close-delimited: the end of the connection is the end of the body
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def _main(port: int) -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    asyncio.run(_main(ap.parse_args().port))


if __name__ == "__main__":
    main()
