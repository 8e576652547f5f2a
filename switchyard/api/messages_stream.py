"""Chat Completions SSE -> Anthropic Messages SSE: the stream translator of the Messages dialect.

Upstream chat bytes in (split anywhere), Anthropic's events out, built from messages_render's
helpers so that the anthropic SDK's MessageStream accumulates them to exactly the message
`render` makes of the same answer. Why it is as it is:
- `message_start` goes out with the upstream's first chunk, then a `ping` (as Anthropic sends).
  Its usage is all zeros: the prompt's count is known only from the upstream's usage chunk at the
  end, and `message_delta` carries the final input_tokens, output_tokens and cache counts (the
  SDK takes message_delta's counts as the totals).
- Text streams live as `text_delta`s in one text block, the first.
- A tool call's arguments are held until its call is complete (the upstream's finish chunk), then
  sent as one `input_json_delta`: Anthropic's input is a JSON object, a client parses every
  fragment as it comes (the SDK raises on invalid JSON), and a model's arguments are not always
  JSON; held, they are checked first and sent as {} when they are not an object, as render does.
  Tool blocks follow the text block, in the upstream's call order.
- A failure mid-stream (an error chunk from the upstream, or `error()` from the relay) ends the
  stream with `event: error` in Anthropic's shape, never a silent cut.
"""

from __future__ import annotations

from typing import Any

import orjson

from switchyard.api.dialect import Parsed
from switchyard.api.messages_render import (
    error_event,
    error_message,
    error_type,
    message_id,
    stop_of,
    tool_input,
    tool_use_id,
    usage_block,
)

MAX_EVENT = 1 << 20  # bytes of one upstream SSE event still incomplete: past it, the stream fails


def _sse(event: bytes, obj: dict) -> bytes:
    return b"event: " + event + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


_PING = _sse(b"ping", {"type": "ping"})
_STOP = _sse(b"message_stop", {"type": "message_stop"})


class _Call:
    __slots__ = ("id", "name", "args")

    def __init__(self) -> None:
        self.id: Any = None
        self.name = ""
        self.args: list[str] = []


class MessagesStream:
    """Upstream chat SSE bytes in (feed, split anywhere), Anthropic SSE bytes out."""

    def __init__(self, parsed: Parsed) -> None:
        self.parsed = parsed
        self.model = parsed.native.get("model", "")
        self.parts: list[bytes] = []  # the event being received, not yet complete
        self.pending = 0  # bytes in parts: bounded by MAX_EVENT
        self.cr = False  # the last chunk ended in \r (of a \r\n split between chunks)
        self.started = False
        self.finished = False  # message_stop or an error sent: nothing more goes out
        self.text_index = -1  # the open text block's index, -1 when none is open
        self.blocks = 0
        self.calls: dict[int, _Call] = {}
        self.calls_sent = False
        self.finish: Any = None
        self.matched: Any = None  # vLLM's stop_reason: the stop string that ended the text
        self.usage: dict | None = None
        self.deltas = 0  # pieces of content seen: the output estimate when no usage comes

    def feed(self, data: bytes) -> bytes:
        if self.finished or not data:
            return b""
        if self.cr:  # the last chunk ended in \r: it may pair with this one's \n
            data = b"\r" + data
            self.cr = False
        if b"\r" in data:
            if data.endswith(b"\r"):
                data = data[:-1]
                self.cr = True
            data = data.replace(b"\r\n", b"\n")
        # Events end at a blank line. Only the new bytes are searched (and the last byte held, which
        # may be half a boundary): linear however the upstream splits its events.
        held = 1 if self.parts and self.parts[-1].endswith(b"\n") else 0
        scan = b"\n" + data if held else data
        out: list[bytes] = []
        start = pos = 0
        while True:
            i = scan.find(b"\n\n", pos)
            if i < 0:
                break
            end = i + 2 - held
            piece = data[start:end]
            event = b"".join((*self.parts, piece)) if self.parts else piece
            self.parts = []
            self.pending = 0
            start, pos = end, i + 2
            out.append(self._dispatch(event[:-2]))
            if self.finished:
                return b"".join(out)
        if start < len(data):
            self.parts.append(data[start:])
            self.pending += len(data) - start
            if self.pending > MAX_EVENT:
                out.append(self.error(f"the upstream sent an event of more than {MAX_EVENT} bytes"))
        return b"".join(out)

    def close(self) -> bytes:
        if self.finished:
            return b""
        out = []
        if self.parts:  # a last event without its blank line
            out.append(self._dispatch(b"".join(self.parts).rstrip(b"\r\n")))
            self.parts = []
        if not self.finished:
            out.append(self._end())
        return b"".join(out)

    def _dispatch(self, event: bytes) -> bytes:
        """One SSE event (its lines, without the blank line): the chat stream says everything in
        data lines; comments, ids and event names carry nothing here."""
        if event.startswith(b"data: ") and b"\n" not in event:  # what every chat server sends
            return self._event(event[6:])
        data = [line[6:] if line.startswith(b"data: ") else line[5:]
                for line in event.split(b"\n") if line.startswith(b"data:")]
        return self._event(b"\n".join(data)) if data else b""

    def error(self, message: str, kind: str = "api_error") -> bytes:
        if self.finished:
            return b""
        self.finished = True
        return error_event(kind, message)

    # --- one upstream event

    def _event(self, payload: bytes) -> bytes:
        if payload == b"[DONE]":
            return self._end()
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return self.error(f"the upstream sent an event that is not JSON: {payload[:100]!r}")
        if type(obj) is not dict:  # type() over isinstance: this runs once per token
            return b""
        if obj.get("error"):
            return self._upstream_error(obj["error"])
        out = b"" if self.started else self._start(obj.get("id"))
        usage = obj.get("usage")
        if type(usage) is dict:
            self.usage = usage
        choices = obj.get("choices")
        if not choices or type(choices) is not list or self.calls_sent or type(choices[0]) is not dict:
            return out
        choice = choices[0]
        delta = choice.get("delta")
        if type(delta) is dict:
            text = delta.get("content")
            if text and type(text) is str:
                out += self._text(text)
            tcs = delta.get("tool_calls")
            if tcs and type(tcs) is list:
                self._tool_deltas(tcs)
        if choice.get("finish_reason") is not None:
            self.finish = choice["finish_reason"]
            self.matched = choice.get("stop_reason")
            out += self._close_blocks()
        return out

    def _upstream_error(self, err: Any) -> bytes:
        """An error chunk (our engine's, vLLM's): Anthropic's error event."""
        e = err if isinstance(err, dict) else {"message": str(err)}
        code = e.get("code") if isinstance(e.get("code"), str) else None
        msg = e.get("message") if isinstance(e.get("message"), str) else "the upstream failed mid-stream"
        return self.error(error_message(500, msg, None, code), error_type(500, str(e.get("type")), code))

    def _start(self, chat_id: Any) -> bytes:
        self.started = True
        msg = {"id": message_id(chat_id), "type": "message", "role": "assistant", "model": self.model,
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                         "cache_read_input_tokens": 0}}
        return _sse(b"message_start", {"type": "message_start", "message": msg}) + _PING

    def _text(self, text: str) -> bytes:
        self.deltas += 1
        out = b""
        if self.text_index < 0:
            self.text_index = self.blocks
            self.blocks += 1
            out = _sse(b"content_block_start", {"type": "content_block_start", "index": self.text_index,
                                                "content_block": {"type": "text", "text": ""}})
        # The event built as bytes around the one value that varies: the most frequent event by far.
        return (out + b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
                + str(self.text_index).encode() + b',"delta":{"type":"text_delta","text":' + orjson.dumps(text)
                + b"}}\n\n")

    def _tool_deltas(self, tcs: list[Any]) -> None:
        for tc in tcs:
            if not isinstance(tc, dict):
                continue
            idx = tc.get("index")
            if not isinstance(idx, int) or isinstance(idx, bool):  # OpenAI always numbers them; some servers do not
                last = max(self.calls, default=-1)
                idx = last + 1 if last < 0 or tc.get("id") else last
            call = self.calls.get(idx)
            if call is None:
                call = self.calls[idx] = _Call()
            if isinstance(tc.get("id"), str) and tc["id"]:
                call.id = tc["id"]
            fn = tc.get("function")
            if isinstance(fn, dict):
                if isinstance(fn.get("name"), str) and fn["name"]:
                    call.name = fn["name"]
                args = fn.get("arguments")
                if isinstance(args, str) and args:
                    call.args.append(args)
                    self.deltas += 1
                elif isinstance(args, dict):
                    call.args = [orjson.dumps(args).decode()]

    def _close_blocks(self) -> bytes:
        out = []
        if self.text_index >= 0:
            out.append(_sse(b"content_block_stop", {"type": "content_block_stop", "index": self.text_index}))
            self.text_index = -1
        if not self.calls_sent:
            self.calls_sent = True
            for idx in sorted(self.calls):
                call = self.calls[idx]
                i = self.blocks
                self.blocks += 1
                _, text = tool_input("".join(call.args), call.name)
                block = {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": {}}
                out.append(_sse(b"content_block_start", {"type": "content_block_start", "index": i,
                                                         "content_block": block}))
                out.append(_sse(b"content_block_delta", {"type": "content_block_delta", "index": i,
                                                         "delta": {"type": "input_json_delta",
                                                                   "partial_json": text}}))
                out.append(_sse(b"content_block_stop", {"type": "content_block_stop", "index": i}))
        return b"".join(out)

    def _end(self) -> bytes:
        out = [] if self.started else [self._start(None)]
        out.append(self._close_blocks())
        stop_reason, stop_sequence = stop_of(self.finish, self.matched, self.parsed, bool(self.calls))
        usage = usage_block(self.usage) if self.usage is not None else {"output_tokens": self.deltas}
        out.append(_sse(b"message_delta", {"type": "message_delta",
                                           "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                           "usage": usage}))
        out.append(_STOP)
        self.finished = True
        return b"".join(out)
