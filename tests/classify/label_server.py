"""A tiny real OpenAI-style server for the LLM classifier tests (stdlib only, its own process).

--delay S: sleep before answering (a slow pool). --mode: `label` answers one label token with
logprobs over a fixed top list; `keyword` answers " complex" when the request it is asked about
says HARD, else " simple" (a deterministic classifier for routing tests); `nologprobs` answers
the word without logprobs; `garbage` answers a non-label word; `error` answers HTTP 500.
Counts the chat calls it got at GET /calls.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CALLS = 0
_lock = threading.Lock()


def completion(mode: str, body: dict) -> dict:
    if mode == "garbage":
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "banana"}}]}
    if mode == "nologprobs":
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Simple"}}]}
    # Split probability over label-starting tokens the way a real tokenizer does (" complex", "Complex").
    top = [(" complex", 0.5), ("Complex", 0.2), (" simple", 0.2), ("The", 0.1)]
    if mode == "keyword":
        hard = "HARD" in json.dumps(body.get("messages", []))
        top = [(" complex", 0.9), (" simple", 0.1)] if hard else [(" simple", 0.8), (" complex", 0.2)]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": body.get("model", "test"),
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": top[0][0]},
            "finish_reason": "length",
            "logprobs": {"content": [{
                "token": top[0][0],
                "logprob": math.log(top[0][1]),
                "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in top],
            }]},
        }],
        "usage": {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--mode", default="label", choices=["label", "keyword", "nologprobs", "garbage", "error"])
    args = ap.parse_args()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _send(self, status: int, obj: object) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(200, {"calls": CALLS} if self.path == "/calls" else {"status": "ok"})

        def do_POST(self) -> None:
            global CALLS
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with _lock:
                CALLS += 1
            time.sleep(args.delay)
            if args.mode == "error":
                self._send(500, {"error": {"message": "boom", "type": "server_error"}})
            else:
                self._send(200, completion(args.mode, body))

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
