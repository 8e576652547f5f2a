"""Chat Completions SSE -> the Responses event stream: the stream translator of the Responses
dialect (responses.py), its events built from responses_render's shapes."""

from __future__ import annotations

from typing import Any

import orjson

from switchyard.api.responses_render import (
    ResponsesCtx,
    call_item,
    event,
    message_item,
    new_id,
    response_object,
    usage_of,
)


class ResponsesStream:
    """Chat Completions SSE (split anywhere) -> the Responses event stream, as OpenAI sends it:
    response.created, response.in_progress, then per output item .output_item.added, (text)
    .content_part.added, .output_text.delta..., .output_text.done, .content_part.done, (call)
    .function_call_arguments.delta..., .function_call_arguments.done, and .output_item.done, then
    response.completed (or response.incomplete at max_output_tokens). `result` holds the final
    Response object once closed."""

    def __init__(self, ctx: ResponsesCtx, model: str) -> None:
        self.ctx = ctx
        self.model = model
        self.seq = 0
        self.buf = b""
        self.started = False
        self.items: list[dict] = []  # output items, final form, by output_index
        self.text_at: int | None = None  # output index of the open message item
        self.text: list[str] = []
        self.calls: dict[int, int] = {}  # the chat tool call index -> its output index
        self.args: dict[int, list[str]] = {}  # output index -> argument pieces
        self.finish: str | None = None
        self.usage: Any = None
        self.failed = False
        self.result: dict | None = None

    def _ev(self, kind: str, payload: dict) -> bytes:
        out = event(kind, self.seq, payload)
        self.seq += 1
        return out

    def _start(self) -> bytes:
        self.started = True
        r = response_object(self.ctx, self.model, "in_progress", [], None)
        return self._ev("response.created", {"response": r}) + self._ev("response.in_progress", {"response": r})

    def feed(self, data: bytes) -> bytes:
        out = [] if self.started else [self._start()]
        if self.failed:
            return b"".join(out)
        lines = (self.buf + data if self.buf else data).split(b"\n")
        self.buf = lines.pop()  # the line not yet complete
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload and payload != b"[DONE]":
                    out.append(self._chunk(payload))
                    if self.failed:
                        break
        return b"".join(out)

    def _chunk(self, payload: bytes) -> bytes:
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(obj, dict):
            return b""
        if "error" in obj:  # an upstream (or a gateway before us) reporting a failure mid-stream
            err = obj["error"]
            msg = err.get("message") if isinstance(err, dict) else None
            return self.error(msg if isinstance(msg, str) else "the upstream failed mid-stream")
        if isinstance(obj.get("model"), str):
            self.model = obj["model"]
        if obj.get("usage"):
            self.usage = obj["usage"]
        out = []
        for ch in obj.get("choices") or ():
            if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                continue
            delta = ch.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                out.append(self._text(text))
            for tc in delta.get("tool_calls") or ():
                out.append(self._call(tc))
            if ch.get("finish_reason"):
                self.finish = ch["finish_reason"]
        return b"".join(out)

    def _text(self, text: str) -> bytes:
        out = b""
        if self.text_at is None:
            self.text_at = len(self.items)
            item = message_item(new_id("msg_"), "", "in_progress")
            self.items.append(item)
            out += self._ev("response.output_item.added", {"output_index": self.text_at, "item": item})
            out += self._ev("response.content_part.added", {
                "item_id": item["id"], "output_index": self.text_at, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
        self.text.append(text)
        return out + self._ev("response.output_text.delta", {
            "item_id": self.items[self.text_at]["id"], "output_index": self.text_at, "content_index": 0,
            "delta": text, "logprobs": []})

    def _close_text(self) -> bytes:
        if self.text_at is None:
            return b""
        i, self.text_at = self.text_at, None
        text = "".join(self.text)
        item = message_item(self.items[i]["id"], text, "completed")
        self.items[i] = item
        part = item["content"][0]
        return (self._ev("response.output_text.done", {"item_id": item["id"], "output_index": i, "content_index": 0,
                                                        "text": text, "logprobs": []})
                + self._ev("response.content_part.done", {"item_id": item["id"], "output_index": i,
                                                           "content_index": 0, "part": part})
                + self._ev("response.output_item.done", {"output_index": i, "item": item}))

    def _call(self, tc: Any) -> bytes:
        if not isinstance(tc, dict):
            return b""
        k = tc.get("index", 0)
        fn = tc.get("function") or {}
        out = b""
        at = self.calls.get(k)
        if at is None:
            out += self._close_text()  # a message item ends where the calls begin
            at = self.calls[k] = len(self.items)
            item = call_item(new_id("fc_"), tc.get("id") or new_id("call_"), fn.get("name") or "", "",
                             "in_progress")
            self.items.append(item)
            self.args[at] = []
            out += self._ev("response.output_item.added", {"output_index": at, "item": item})
        elif fn.get("name"):  # a name sent in pieces
            self.items[at]["name"] += fn["name"]
        piece = fn.get("arguments")
        if isinstance(piece, str) and piece:
            self.args[at].append(piece)
            out += self._ev("response.function_call_arguments.delta", {
                "item_id": self.items[at]["id"], "output_index": at, "delta": piece})
        return out

    def close(self) -> bytes:
        if self.failed:
            return b""
        out = [] if self.started else [self._start()]
        if self.buf.strip():  # a last event without its blank line
            self.buf += b"\n"
            out.append(self.feed(b""))
        out.append(self._close_text())
        for at in sorted(self.args):
            old = self.items[at]
            args = "".join(self.args[at])
            item = call_item(old["id"], old["call_id"], old["name"], args, "completed")
            self.items[at] = item
            out.append(self._ev("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": at, "name": item["name"], "arguments": args}))
            out.append(self._ev("response.output_item.done", {"output_index": at, "item": item}))
        incomplete = self.finish == "length"
        status = "incomplete" if incomplete else "completed"
        self.result = response_object(self.ctx, self.model, status, self.items, usage_of(self.usage), incomplete)
        out.append(self._ev("response.incomplete" if incomplete else "response.completed", {"response": self.result}))
        return b"".join(out)

    def error(self, message: str) -> bytes:
        """OpenAI's error event, then response.failed: the SDK raises, Codex reports it (and retries)."""
        if self.failed:
            return b""
        out = b"" if self.started else self._start()
        self.failed = True
        failed = response_object(self.ctx, self.model, "failed", self.items, usage_of(self.usage),
                                 error={"code": "server_error", "message": message})
        return (out + self._ev("error", {"code": "upstream_error", "message": message, "param": None})
                + self._ev("response.failed", {"response": failed}))
