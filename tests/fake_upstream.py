"""An OpenAI-compatible test upstream: a real HTTP server process with behaviour you can steer.

    python tests/fake_upstream.py --port 9101 --name a [--delay-ms 5] [--fail 503] [--fail-first N]
    POST /_control {"delay_ms": 0, "fail": 0, "fail_first": 0, "die_midstream": false, ...}

A raw ASGI app (no framework) so that, as the upstream of the overhead benchmark, it costs
as little as possible. Every answer says which server produced it (x-upstream-name header,
system_fingerprint) and echoes what it received, so tests can check pass-through.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import orjson

STATE: dict = {}


def _config(args: argparse.Namespace) -> dict:
    return {
        "name": args.name,
        "delay_ms": args.delay_ms,
        "fail": args.fail,  # status code to answer every request with (0: none)
        "fail_first": args.fail_first,  # fail only the first N requests
        "die_midstream": False,  # stream two chunks then drop the connection
        "die_after_chunks": 2,
        "stream_chunks": 5,
        "chunk_delay_ms": 0.0,
        "chunk_pad": 0,  # extra characters in each streamed chunk (a stream of megabytes)
        "fail_message": "failing on purpose",  # the error message of `fail` answers
        "health": 200,
        "max_model_len": args.max_model_len or None,  # reported in /v1/models, as vLLM does
        "tool_call": None,  # {"name": ..., "arguments": {...}} to answer with a tool call
        "cached_tokens": 0,  # usage.prompt_tokens_details.cached_tokens (0: no details)
        "metrics": None,  # text served at GET /metrics (Prometheus), None: 404
        "metrics_served": 0,
        "served": 0,
        "inflight": 0,
        "max_inflight": 0,
        "cancelled": 0,
        "last_body": None,
        "last_headers": None,
        "last_path": None,
        "tokenize": True,  # serve POST /tokenize
    }


async def _read_body(receive) -> bytes:
    parts = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionError
        parts.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(parts)


async def _send_json(send, status: int, obj, extra: list | None = None) -> None:
    body = orjson.dumps(obj)
    headers = [(b"content-type", b"application/json"), (b"x-upstream-name", STATE["name"].encode())]
    if extra:
        headers += extra
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _usage() -> dict:
    usage: dict = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if STATE["cached_tokens"]:
        usage["prompt_tokens_details"] = {"cached_tokens": STATE["cached_tokens"]}
    return usage


def _completion(body: dict, kind: str) -> dict:
    msgs = body.get("messages") or []
    last = ""
    for m in msgs:
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            last = c if isinstance(c, str) else orjson.dumps(c).decode()
    text = f"{STATE['name']} echoes: {last or body.get('prompt', '')}"[:2000]
    usage = _usage()
    common = {"id": f"cmpl-{STATE['served']}", "created": int(time.time()), "model": body.get("model"),
              "system_fingerprint": STATE["name"], "usage": usage}
    if kind == "completions":
        return {**common, "object": "text_completion",
                "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]}
    message: dict = {"role": "assistant", "content": text}
    finish = "stop"
    tc = STATE.get("tool_call")
    if tc and body.get("tools"):
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": tc["name"], "arguments": orjson.dumps(tc.get("arguments", {})).decode()}}]}
        finish = "tool_calls"
    n = body.get("n") if isinstance(body.get("n"), int) else 1
    return {**common, "object": "chat.completion",
            "choices": [{"index": i, "message": message, "finish_reason": finish, "logprobs": None} for i in range(n)]}


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path, method = scope["path"], scope["method"]
    if path == "/health":
        code = STATE["health"]
        return await _send_json(send, code, {"status": "ok" if code == 200 else "unhealthy"})
    if path == "/v1/models":
        model = {"id": "fake", "object": "model"}
        if STATE["max_model_len"]:
            model["max_model_len"] = STATE["max_model_len"]
        return await _send_json(send, 200, {"object": "list", "data": [model]})
    if path == "/metrics" and method == "GET":
        if STATE["metrics"] is None:
            return await _send_json(send, 404, {"error": {"message": "no metrics", "type": "not_found"}})
        STATE["metrics_served"] += 1
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": STATE["metrics"].encode()})
        return
    if path == "/_state":
        return await _send_json(send, 200, {k: v for k, v in STATE.items()})
    try:
        raw = await _read_body(receive)
    except ConnectionError:
        return
    if path == "/_control" and method == "POST":
        STATE.update(orjson.loads(raw or b"{}"))
        return await _send_json(send, 200, {"ok": True})
    if path == "/tokenize" and method == "POST" and STATE["tokenize"]:  # llama-server's: one token a word here
        req = orjson.loads(raw)
        if "content" not in req:  # llama-server takes text only; our engine and vLLM take messages too
            return await _send_json(send, 400, {"error": {"message": "'content' is required", "type": "invalid"}})
        return await _send_json(send, 200, {"tokens": list(range(len(req["content"].split())))})
    if path == "/v1/responses" and method == "POST":  # a server that speaks the Responses API itself
        return await _responses(raw, path, scope, send)
    if path not in ("/v1/chat/completions", "/v1/completions") or method != "POST":
        return await _send_json(send, 404, {"error": {"message": "not found", "type": "not_found"}})
    STATE["served"] += 1
    STATE["inflight"] += 1
    STATE["max_inflight"] = max(STATE["max_inflight"], STATE["inflight"])
    try:
        body = orjson.loads(raw)
        STATE["last_body"], STATE["last_path"] = body, path
        STATE["last_headers"] = {k.decode(): v.decode() for k, v in scope["headers"]}
        if STATE["fail_first"] > 0:
            STATE["fail_first"] -= 1
            return await _send_json(send, 503, {"error": {"message": "warming up", "type": "server_error"}})
        if STATE["fail"]:
            return await _send_json(send, STATE["fail"], {"error": {"message": STATE["fail_message"],
                                                                     "type": "server_error"}})
        if STATE["delay_ms"]:
            try:
                await _sleep_or_disconnect(STATE["delay_ms"] / 1000, receive)
            except ConnectionError:
                STATE["cancelled"] += 1
                return
        kind = "chat" if path.endswith("chat/completions") else "completions"
        if body.get("stream"):
            return await _stream(body, kind, send, receive)
        await _send_json(send, 200, _completion(body, kind))
    finally:
        STATE["inflight"] -= 1


async def _responses(raw: bytes, path: str, scope, send) -> None:
    """POST /v1/responses answered natively: `native <input text>`, as a body or OpenAI's events."""
    STATE["served"] += 1
    body = orjson.loads(raw)
    STATE["last_body"], STATE["last_path"] = body, path
    STATE["last_headers"] = {k.decode(): v.decode() for k, v in scope["headers"]}
    if STATE["fail"]:
        return await _send_json(send, STATE["fail"], {"error": {"message": STATE["fail_message"],
                                                                 "type": "server_error"}})
    inp = body.get("input")
    text = f"native {inp if isinstance(inp, str) else orjson.dumps(inp).decode()}"
    item = {"id": "msg_native", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}
    usage = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10,
             "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    resp = {"id": f"resp_native{STATE['served']}", "object": "response", "created_at": 0, "status": "completed",
            "model": body.get("model"), "output": [item], "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": [], "usage": usage}
    if not body.get("stream"):
        return await _send_json(send, 200, resp)
    headers = [(b"content-type", b"text/event-stream"), (b"x-upstream-name", STATE["name"].encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    events = [
        {"type": "response.created", "response": {**resp, "status": "in_progress", "output": [], "usage": None}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress",
                                                                          "content": []}},
        {"type": "response.content_part.added", "item_id": "msg_native", "output_index": 0, "content_index": 0,
         "part": {"type": "output_text", "text": "", "annotations": []}},
        {"type": "response.output_text.delta", "item_id": "msg_native", "output_index": 0, "content_index": 0,
         "delta": text, "logprobs": []},
        {"type": "response.output_text.done", "item_id": "msg_native", "output_index": 0, "content_index": 0,
         "text": text, "logprobs": []},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": resp},
    ]
    data = b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps({**e, "sequence_number": i})
                    + b"\n\n" for i, e in enumerate(events))
    await send({"type": "http.response.body", "body": data, "more_body": False})


async def _sleep_or_disconnect(seconds: float, receive) -> None:
    waiter = asyncio.ensure_future(receive())
    done, _ = await asyncio.wait({waiter}, timeout=seconds)
    if waiter in done and waiter.result()["type"] == "http.disconnect":
        raise ConnectionError
    waiter.cancel()


async def _stream(body: dict, kind: str, send, receive) -> None:
    headers = [(b"content-type", b"text/event-stream"), (b"x-upstream-name", STATE["name"].encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    n = STATE["stream_chunks"]
    pad = "x" * STATE["chunk_pad"]
    for i in range(n):
        if STATE["die_midstream"] and i >= STATE["die_after_chunks"]:
            os._exit(17)  # the replica dies mid-stream: the connection drops without a proper end
        if kind == "chat":
            delta = {"role": "assistant", "content": f"tok{i} {pad}"} if i == 0 else {"content": f"tok{i} {pad}"}
            obj = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body.get("model"),
                   "system_fingerprint": STATE["name"],
                   "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        else:
            obj = {"id": "c", "object": "text_completion", "created": 0, "model": body.get("model"),
                   "choices": [{"index": 0, "text": f"tok{i} ", "finish_reason": None}]}
        try:
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(obj) + b"\n\n", "more_body": True})
        except OSError:
            STATE["cancelled"] += 1
            return
        if STATE["chunk_delay_ms"]:
            try:
                await _sleep_or_disconnect(STATE["chunk_delay_ms"] / 1000, receive)
            except ConnectionError:
                STATE["cancelled"] += 1
                return
    end = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body.get("model"),
           "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    tail = b"data: " + orjson.dumps(end) + b"\n\n"
    opts = body.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage"):  # as OpenAI: one more chunk, no choices
        usage = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body.get("model"),
                 "choices": [], "usage": _usage()}
        tail += b"data: " + orjson.dumps(usage) + b"\n\n"
    await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--name", default="upstream")
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--fail", type=int, default=0)
    ap.add_argument("--fail-first", type=int, default=0)
    ap.add_argument("--max-model-len", type=int, default=0, help="context window reported in /v1/models")
    ap.add_argument("--keep-alive", type=float, default=5.0, help="seconds an idle connection stays open")
    args = ap.parse_args()
    STATE.update(_config(args))
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, lifespan="on", timeout_keep_alive=args.keep_alive)


if __name__ == "__main__":
    main()
