"""A small real OpenAI-compatible server for replay tests (run as its own process).

    python tests/replay/replay_upstream.py --port P --answers answers.json [--wrong-every N]
        [--delay SECONDS] [--fail-first N]

It answers POST /v1/chat/completions with the tool calls stored for the request's
messages (answers.json: {sha256 of the messages JSON: [{"name", "arguments"}...]}), which
the tests fill from the cases' ground truth. With --wrong-every N, one answer in N (chosen
by the same hash) comes back with no call at all: a weaker "small model". Usage counts
characters / 4 as tokens. GET /health and /v1/models answer too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def messages_key(messages: Any) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class Handler(BaseHTTPRequestHandler):
    answers: dict[str, list[dict[str, Any]]] = {}
    wrong_every = 0
    delay_s = 0.0
    fail_first = 0  # answer 503 to this many chat requests first (retry tests)
    _lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _send(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/health", "/v1/health"):
            self._send(200, {"status": "ok"})
        elif self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "test-model", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, {"error": {"message": "not found", "type": "not_found"}})
            return
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
        with self._lock:
            failing = Handler.fail_first > 0
            if failing:
                Handler.fail_first -= 1
        if failing:
            self._send(503, {"error": {"message": "warming up", "type": "server_error"}})
            return
        key = messages_key(body.get("messages"))
        calls = self.answers.get(key)
        if calls is None:
            self._send(400, {"error": {"message": "unknown case", "type": "invalid_request_error"}})
            return
        if self.wrong_every and int(key[:8], 16) % self.wrong_every == 0:
            calls = []
        if self.delay_s:
            time.sleep(self.delay_s)
        message: dict[str, Any] = {"role": "assistant", "content": None if calls else "I cannot help with that."}
        if calls:
            message["tool_calls"] = [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for i, c in enumerate(calls)
            ]
        prompt = len(json.dumps(body.get("messages"))) + len(json.dumps(body.get("tools") or []))
        completion = len(json.dumps(message))
        self._send(200, {
            "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "test-model"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": prompt // 4, "completion_tokens": completion // 4,
                      "total_tokens": prompt // 4 + completion // 4},
        })


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--answers", required=True)
    ap.add_argument("--wrong-every", type=int, default=0)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--fail-first", type=int, default=0)
    args = ap.parse_args()
    with open(args.answers, encoding="utf-8") as f:
        Handler.answers = json.load(f)
    Handler.wrong_every = args.wrong_every
    Handler.delay_s = args.delay
    Handler.fail_first = args.fail_first
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on {args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
