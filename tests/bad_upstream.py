"""A misbehaving upstream: a raw HTTP/1.1 server process that answers whatever it is told to.

    python tests/bad_upstream.py --port 9101
    POST /_control {"status": 200, "headers": [["Content-Type", "text/html"]], "body": "...", ...}
    GET /_state    -> {"served": N, "last_headers": {...}, "stolen": N}

Raw sockets, not a framework, so that it can send what a framework would refuse: control bytes
in header values, a Content-Encoding that does not match the body, redirects, Set-Cookie, bodies
of hundreds of megabytes sent as fast as the socket takes them. GET /health always answers 200
unless `health_status` says otherwise; anything sent to /stolen (a redirect's target) is counted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip

import orjson

DEFAULT = {
    "status": 200,
    "headers": [["Content-Type", "application/json"]],  # [name, value] (latin-1: any byte may go in)
    "body": '{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
            '"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,'
            '"total_tokens":4}}',
    "body_b64": None,  # raw bytes instead of `body`
    "gzip": False,  # gzip the body and say so in Content-Encoding
    "gzip_header": True,  # with gzip: send the Content-Encoding header
    "pad_bytes": 0,  # send this many bytes (a JSON string's inside) in place of the body, chunked
    "echo_auth": False,  # put the request's Authorization header into the body (an upstream echoing it)
    "close_framing": False,  # no Content-Length nor chunks: the body ends when the connection closes
    "cut_at": None,  # with close_framing: close after this many bytes of the body (a stream that dies)
    "health_status": 200,
    "metrics_status": 200,
    "metrics_headers": [["Content-Type", "text/plain"]],
}
STATE: dict = {"served": 0, "stolen": 0, "last_headers": {}, "health": 0, "metrics": 0, "cfg": dict(DEFAULT)}


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = b""
    n = int(headers.get("content-length") or 0)
    if n:
        body = await reader.readexactly(n)
    return method, path, headers, body


def _head(status: int, headers: list[list[str]], extra: str) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers] + [extra, "", ""]
    return "\r\n".join(x for x in lines if x is not None).encode("latin-1")


async def _answer(writer: asyncio.StreamWriter, status: int, headers: list[list[str]], body: bytes) -> None:
    writer.write(_head(status, headers, f"Content-Length: {len(body)}") + body)
    await writer.drain()


async def _configured(writer: asyncio.StreamWriter, req_headers: dict[str, str]) -> None:
    cfg = STATE["cfg"]
    headers = [list(h) for h in cfg["headers"]]
    if cfg["close_framing"]:
        body = base64.b64decode(cfg["body_b64"]) if cfg["body_b64"] else cfg["body"].encode()
        writer.write(_head(cfg["status"], headers, "Connection: close") + body[: cfg["cut_at"]])
        await writer.drain()
        writer.close()
        return
    if cfg["pad_bytes"]:
        writer.write(_head(cfg["status"], headers, "Transfer-Encoding: chunked"))
        piece = b"x" * (1 << 20)

        def chunk(b: bytes) -> bytes:
            return f"{len(b):x}\r\n".encode() + b + b"\r\n"

        writer.write(chunk(b'{"pad":"'))
        left = cfg["pad_bytes"]
        while left > 0:
            b = piece[: min(left, len(piece))]
            left -= len(b)
            writer.write(chunk(b))
            await writer.drain()
        writer.write(chunk(b'"}') + b"0\r\n\r\n")
        await writer.drain()
        return
    body = base64.b64decode(cfg["body_b64"]) if cfg["body_b64"] else cfg["body"].encode()
    if cfg["echo_auth"]:
        body = orjson.dumps({"error": {"message": f"bad request; you sent {req_headers.get('authorization', '')}",
                                       "type": "invalid_request_error"}})
    if cfg["gzip"]:
        body = gzip.compress(body)
        if cfg["gzip_header"]:
            headers.append(["Content-Encoding", "gzip"])
    await _answer(writer, cfg["status"], headers, body)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            req = await _read_request(reader)
            if req is None:
                return
            method, path, headers, body = req
            json = [["Content-Type", "application/json"]]
            if path == "/_control":
                STATE["cfg"] = {**DEFAULT, **orjson.loads(body or b"{}")}
                await _answer(writer, 200, json, b"{}")
            elif path == "/_state":
                out = {k: v for k, v in STATE.items() if k != "cfg"}
                await _answer(writer, 200, json, orjson.dumps(out))
            elif path.startswith("/stolen"):
                STATE["stolen"] += 1
                await _answer(writer, 200, json, DEFAULT["body"].encode())
            elif path == "/health":
                STATE["health"] += 1
                st = STATE["cfg"]["health_status"]
                extra = [["Location", STATE["cfg"].get("location", "/stolen")]] if 300 <= st < 400 else []
                await _answer(writer, st, json + extra, b"{}")
            elif path == "/metrics":
                STATE["metrics"] += 1
                st = STATE["cfg"]["metrics_status"]
                await _answer(writer, st, [list(h) for h in STATE["cfg"]["metrics_headers"]],
                              b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n")
            else:
                STATE["served"] += 1
                STATE["last_headers"] = headers
                await _configured(writer, headers)
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    asyncio.run(main(ap.parse_args().port))
