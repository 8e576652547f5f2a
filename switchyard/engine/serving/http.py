"""Rank 0's HTTP server: OpenAI-compatible endpoints, /health and vLLM-named /metrics.

The scheduler runs in its own thread; each request gets an asyncio queue that the engine
thread feeds through call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from switchyard.engine.chat.grammar import GrammarError, GrammarState
from switchyard.engine.chat.structured import constraint
from switchyard.engine.chat.tokenizer import ChatTokenizer
from switchyard.engine.chat.tool_stream import ToolCallStream
from switchyard.engine.core.scheduler import Scheduler
from switchyard.engine.core.sequence import Sequence
from switchyard.engine.errors import QueueFull
from switchyard.engine.serving.metrics import Metrics
from switchyard.engine.serving.protocol import (
    RequestError,
    chat_messages,
    check_length,
    sampling_params,
    tools_of,
)
from switchyard.engine.serving.state import EngineState
from switchyard.engine.serving.tokenize import tokenize


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


_SSE_DONE = b"data: [DONE]\n\n"


def _engine_failed(message: str) -> RequestError:
    """The one error a request gets when the engine fails under it (a JSON 500, or an SSE
    error event once a stream has started)."""
    return RequestError(message, status=500, type_="server_error", code="engine_failed")


@dataclass
class _Run:
    """One submitted request: its sequence and the queue the engine thread feeds."""

    seq: Sequence
    queue: asyncio.Queue[dict[str, Any]]


@dataclass
class _Collected:
    """A whole (non-streamed) reply."""

    text: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    reason: str = "stop"
    usage: dict[str, Any] = field(default_factory=dict)


def _chat_logprobs(tok: ChatTokenizer, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in entries:
        t = tok.id_to_token(e["id"])
        out.append({"token": t, "logprob": e["logprob"], "bytes": list(t.encode()),
                    "top_logprobs": [{"token": (s := tok.id_to_token(i)), "logprob": lp,
                                      "bytes": list(s.encode())} for i, lp in e["top"]]})
    return out


def _completion_logprobs(tok: ChatTokenizer, entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    toks = [tok.id_to_token(e["id"]) for e in entries]
    offsets, o = [], offset
    for t in toks:
        offsets.append(o)
        o += len(t)
    return {"tokens": toks, "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{tok.id_to_token(i): lp for i, lp in e["top"]} for e in entries],
            "text_offset": offsets}


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise RequestError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


class EngineHandlers:
    """The HTTP endpoints of one engine replica, over the state the engine thread fills in."""

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.metrics = Metrics(state)

    # -- plumbing shared by the generating endpoints ---------------------------------------

    def _engine(self) -> tuple[Scheduler, ChatTokenizer]:
        st = self.state
        if not st.ready or st.scheduler is None or st.tokenizer is None:
            raise RequestError(f"the engine is not ready ({st.phase})", status=503, type_="server_error",
                               code="not_ready")
        return st.scheduler, st.tokenizer

    def _start(self, prompt: list[int], params: Any, grammar: GrammarState | None = None) -> _Run:
        sched, _ = self._engine()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def sink(ev: dict[str, Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, ev)

        seq = Sequence(prompt=prompt, params=params, sink=sink, grammar=grammar)
        try:
            sched.submit(seq)
        except QueueFull as e:
            raise RequestError(str(e), status=429, type_="rate_limit_exceeded", code="queue_full") from None
        except RuntimeError as e:
            raise RequestError(str(e), status=503, type_="server_error", code="engine_failed") from None
        return _Run(seq, queue)

    async def _events(self, run: _Run, request: Request | None = None) -> AsyncIterator[dict[str, Any]]:
        """The run's events up to its finish or error; aborts the sequence if the consumer
        stops early (a stream's client left) or, given `request`, when the client disconnects."""
        watcher = None
        if request is not None:
            # Not streaming: nothing is sent until the end, so watch for the client leaving and
            # stop generating for it then (a stream notices at its next write).
            async def watch() -> None:
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                run.queue.put_nowait({"type": "gone"})

            watcher = asyncio.get_running_loop().create_task(watch())
        finished = False
        try:
            while True:
                ev = await run.queue.get()
                if ev["type"] == "gone":
                    return
                yield ev
                if ev["type"] in ("finish", "error"):
                    finished = True
                    return
        finally:
            if watcher is not None:
                watcher.cancel()
            if not finished and self.state.scheduler is not None:
                self.state.scheduler.abort(run.seq.id)

    async def _collect(self, run: _Run, request: Request) -> _Collected:
        """A non-streamed reply, whole; an engine failure raises (the app answers 500)."""
        out = _Collected()
        async for ev in self._events(run, request):
            if ev["type"] == "delta":
                out.text += ev["text"]
                out.logprobs.extend(ev.get("logprobs", []))
            elif ev["type"] == "finish":
                out.reason, out.usage = ev["reason"], ev["usage"]
            else:
                raise _engine_failed(ev["message"])
        return out

    # -- endpoints ---------------------------------------------------------------------------

    async def health(self) -> JSONResponse:
        st = self.state
        body = {"status": "ok" if st.ready else st.phase, "model": st.model_name, "tp": st.tp,
                "dtype": st.dtype, "collective": st.collective, "uptime_s": round(time.time() - st.started, 1)}
        if st.device:
            body["device"] = st.device
        body["structured_output"] = st.structured_output()
        s = st.scheduler
        if s is not None:
            if s.pinned is not None:  # --pin-cpus on
                body["cpus"] = {"loop": s.pinned.engine, "grammar_fill": s.pinned.fill}
            pool = s.pool
            body["kv_cache"] = {"blocks": pool.num_blocks, "block_size": pool.block_size, "free_blocks": pool.num_free,
                                "cached_blocks": pool.num_cached, "usage": round(pool.usage, 4),
                                "prefix_caching": pool.prefix_caching, "prefix_cache_hit_rate": round(pool.hit_rate, 4),
                                "prefix_cache_queries": pool.queries, "prefix_cache_hits": pool.hits,
                                "preemptions": s.stats["preemptions"]}
        if s is not None and s.failed:
            body["status"] = "failed"
            body["reason"] = s.failed
        elif st.reason:
            body["reason"] = st.reason
        return JSONResponse(body, status_code=200 if st.ready else 503)

    async def prometheus(self) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def models(self) -> JSONResponse:
        st = self.state
        return JSONResponse({"object": "list", "data": [{
            "id": st.model_name, "object": "model", "created": int(st.started), "owned_by": "switchyard",
            "root": st.model_name, "max_model_len": st.max_model_len,
            "structured_output": st.structured_output()["supported"]}]})

    async def _grammar(self, body: dict[str, Any], tools: list[dict[str, Any]] | None,
                       ) -> tuple[GrammarState | None, bool]:
        """The request's grammar (compiled off the event loop: a new one takes up to ~20 ms)
        and whether its tool calls are constrained."""
        c = constraint(body, tools)
        if c is None:
            return None, False
        grammars = self.state.grammars
        if grammars is None:
            raise RequestError(f"structured output is unavailable on this replica: {self.state.grammars_reason}",
                               "response_format" if not c.tools else "tool_choice", "structured_output_unavailable")
        try:
            return await asyncio.to_thread(grammars.compile, c), c.tools
        except GrammarError as e:
            raise RequestError(str(e), e.param, "invalid_schema") from None

    async def tokenize(self, request: Request) -> JSONResponse:
        body = await _body(request)
        _, tok = self._engine()
        return JSONResponse(tokenize(tok, body))

    async def chat(self, request: Request) -> Response:
        body = await _body(request)
        messages = chat_messages(body)
        params = sampling_params(body, chat=True)
        tools = tools_of(body)
        _, tok = self._engine()
        grammar, constrained_tools = await self._grammar(body, tools)
        try:
            prompt_text = tok.render(messages, tools)
        except Exception as e:
            raise RequestError(f"the chat template could not render these messages: {e}", "messages") from None
        prompt = tok.encode(prompt_text)
        check_length(len(prompt), params, self.state.max_model_len, "messages")
        run = self._start(prompt, params, grammar)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = body.get("model") or self.state.model_name
        parser = ToolCallStream(tools=bool(tools))
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._chat_stream(tok, run, parser, rid, created, model, include_usage,
                                                       params.logprobs),
                                     media_type="text/event-stream")
        got = await self._collect(run, request)
        parser.feed(got.text)
        parser.finish()
        msg: dict[str, Any] = {"role": "assistant", "content": parser.content or (None if parser.calls else "")}
        if parser.calls:
            msg["tool_calls"] = [c.message() for c in parser.calls]
        choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": _chat_finish(got.reason, parser),
                                  "logprobs": {"content": _chat_logprobs(tok, got.logprobs)}
                                  if params.logprobs else None}
        return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": model,
                             "choices": [choice], "usage": got.usage})

    async def _chat_stream(self, tok: ChatTokenizer, run: _Run, parser: ToolCallStream, rid: str, created: int,
                           model: str, include_usage: bool, logprobs: bool) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None, lp: list[dict[str, Any]] | None = None,
                  ) -> bytes:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            if logprobs:
                choice["logprobs"] = {"content": lp or []}
            return _sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                         "choices": [choice]})

        yield chunk({"role": "assistant", "content": ""})
        held_lp: list[dict[str, Any]] = []  # logprobs of tokens whose text is held back
        async for ev in self._events(run):
            if ev["type"] == "delta":
                if logprobs:
                    held_lp.extend(_chat_logprobs(tok, ev.get("logprobs", [])))
                for delta in parser.feed(ev["text"]):
                    yield chunk(delta, lp=held_lp)
                    held_lp = []
            elif ev["type"] == "finish":
                for delta in parser.finish():
                    yield chunk(delta, lp=held_lp)
                    held_lp = []
                yield chunk({}, _chat_finish(ev["reason"], parser), lp=held_lp)
                if include_usage:
                    yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                                "choices": [], "usage": ev["usage"]})
                yield _SSE_DONE
            else:
                yield _sse(_engine_failed(ev["message"]).body())

    async def completions(self, request: Request) -> Response:
        body = await _body(request)
        params = sampling_params(body, chat=False)
        if body.get("max_tokens") is None:
            params.max_tokens = 16
        _, tok = self._engine()
        prompt = _completion_prompt(tok, body.get("prompt"))
        check_length(len(prompt), params, self.state.max_model_len, "prompt")
        run = self._start(prompt, params)
        rid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = body.get("model") or self.state.model_name

        def lp_obj(entries: list[dict[str, Any]], offset: int) -> dict[str, Any] | None:
            return _completion_logprobs(tok, entries, offset) if params.logprobs else None

        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._completion_stream(run, rid, created, model, include_usage, lp_obj),
                                     media_type="text/event-stream")
        got = await self._collect(run, request)
        return JSONResponse({"id": rid, "object": "text_completion", "created": created, "model": model,
                             "choices": [{"index": 0, "text": got.text, "finish_reason": got.reason,
                                          "logprobs": lp_obj(got.logprobs, 0)}], "usage": got.usage})

    async def _completion_stream(self, run: _Run, rid: str, created: int, model: str, include_usage: bool,
                                 lp_obj: Callable[[list[dict[str, Any]], int], dict[str, Any] | None],
                                 ) -> AsyncIterator[bytes]:
        def chunk(choice: dict[str, Any]) -> bytes:
            return _sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                         "choices": [choice]})

        offset = 0
        async for ev in self._events(run):
            if ev["type"] == "delta":
                yield chunk({"index": 0, "text": ev["text"], "finish_reason": None,
                             "logprobs": lp_obj(ev.get("logprobs", []), offset)})
                offset += len(ev["text"])
            elif ev["type"] == "finish":
                yield chunk({"index": 0, "text": "", "finish_reason": ev["reason"], "logprobs": None})
                if include_usage:  # as OpenAI (and vLLM) send it: one more chunk, with no choices
                    yield _sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                                "choices": [], "usage": ev["usage"]})
                yield _SSE_DONE
            else:
                yield _sse(_engine_failed(ev["message"]).body())


def _chat_finish(reason: str, parser: ToolCallStream) -> str:
    """"tool_calls" when the reply made calls and ended on its own; "length" stays "length"
    (a structure cut by the budget is never reported as complete)."""
    return "tool_calls" if parser.calls and reason == "stop" else reason


def _completion_prompt(tok: ChatTokenizer, p: Any) -> list[int]:
    """/v1/completions' prompt: one string (or a list of one), or a list of token ids."""
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if isinstance(p, str) and p:
        return tok.encode(p)
    if isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool) for i in p):
        if any(i < 0 or i >= tok.vocab_size for i in p):
            raise RequestError("prompt token id out of range", "prompt")
        return list(p)
    raise RequestError("'prompt' must be a non-empty string or a list of token ids", "prompt")


def build_app(state: EngineState) -> FastAPI:
    app = FastAPI(title="switchyard engine")
    h = EngineHandlers(state)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, e: RequestError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    app.add_api_route("/health", h.health, methods=["GET"])
    app.add_api_route("/metrics", h.prometheus, methods=["GET"])
    app.add_api_route("/v1/models", h.models, methods=["GET"])
    app.add_api_route("/v1/chat/completions", h.chat, methods=["POST"])
    app.add_api_route("/v1/completions", h.completions, methods=["POST"])
    app.add_api_route("/tokenize", h.tokenize, methods=["POST"])
    return app
