"""Rank 0's HTTP server: OpenAI-compatible endpoints, /health and vLLM-named /metrics.

The scheduler runs in its own thread; each request gets an asyncio queue that the engine
thread feeds through call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from switchyard.engine.protocol import (
    RequestError,
    chat_messages,
    check_length,
    sampling_params,
    tools_of,
)
from switchyard.engine.scheduler import QueueFull, Scheduler, Sequence
from switchyard.engine.tokenizer import ChatTokenizer
from switchyard.engine.tools import parse_tool_calls


@dataclass
class EngineState:
    """What /health reports; filled in by the engine thread as start-up proceeds."""

    model_name: str
    tp: int
    phase: str = "loading"  # loading | ready | failed | stopping
    reason: str = ""
    collective: dict[str, Any] = field(default_factory=dict)
    scheduler: Scheduler | None = None
    tokenizer: ChatTokenizer | None = None
    max_model_len: int = 0
    started: float = field(default_factory=time.time)
    load_seconds: float = 0.0
    dtype: str = ""
    device: dict[str, Any] = field(default_factory=dict)  # GPU: dtype, CUDA graphs, fused ops

    @property
    def ready(self) -> bool:
        return self.phase == "ready" and self.scheduler is not None and self.scheduler.failed is None


def _err(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _json(obj: Any) -> bytes:
    return orjson.dumps(obj)


class _Metrics:
    def __init__(self, state: EngineState) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", labels,
                             registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting for a slot", labels,
                             registry=self.registry)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = full)", labels, registry=self.registry)
        self.prompt = Counter("vllm:prompt_tokens", "Prefilled tokens", labels, registry=self.registry)
        self.gen = Counter("vllm:generation_tokens", "Generated tokens", labels, registry=self.registry)
        self.success = Counter("vllm:request_success", "Finished requests", labels + ["finished_reason"],
                               registry=self.registry)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token", labels,
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                              registry=self.registry)
        self.healthy = Gauge("switchyard_engine_ready", "1 when the replica serves", labels,
                             registry=self.registry)
        self.state = state
        self._seen = {"prompt_tokens": 0, "generation_tokens": 0}
        self._seen_reason: dict[str, int] = {}
        name = state.model_name
        for g in (self.running, self.waiting, self.kv, self.healthy):
            g.labels(name).set(0)  # present from the first scrape, before the engine is up
        self.prompt.labels(name)
        self.gen.labels(name)

    def render(self) -> bytes:
        st, name = self.state, self.state.model_name
        s = st.scheduler
        if s is not None:
            self.running.labels(name).set(s.num_running)
            self.waiting.labels(name).set(s.num_waiting)
            self.kv.labels(name).set(s.kv_usage)
            for key, counter in (("prompt_tokens", self.prompt), ("generation_tokens", self.gen)):
                now = s.stats[key]
                counter.labels(name).inc(now - self._seen[key])
                self._seen[key] = now
            for reason, n in s.finished_by_reason.items():
                self.success.labels(name, reason).inc(n - self._seen_reason.get(reason, 0))
                self._seen_reason[reason] = n
            fresh, s.ttft = s.ttft, []
            for v in fresh:
                self.ttft.labels(name).observe(v)
        self.healthy.labels(name).set(1 if st.ready else 0)
        return generate_latest(self.registry)


def build_app(state: EngineState) -> FastAPI:
    app = FastAPI(title="switchyard engine")
    metrics = _Metrics(state)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, e: RequestError) -> JSONResponse:
        return _err(e)

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {"status": "ok" if state.ready else state.phase, "model": state.model_name, "tp": state.tp,
                "dtype": state.dtype, "collective": state.collective, "uptime_s": round(time.time() - state.started, 1)}
        if state.device:
            body["device"] = state.device
        s = state.scheduler
        if s is not None and s.failed:
            body["status"] = "failed"
            body["reason"] = s.failed
        elif state.reason:
            body["reason"] = state.reason
        return JSONResponse(body, status_code=200 if state.ready else 503)

    @app.get("/metrics")
    async def prom() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "switchyard",
            "root": state.model_name, "max_model_len": state.max_model_len}]})

    async def _body(request: Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as e:
            raise RequestError(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    def _engine() -> tuple[Scheduler, ChatTokenizer]:
        if not state.ready or state.scheduler is None or state.tokenizer is None:
            raise RequestError(f"the engine is not ready ({state.phase})", status=503, type_="server_error",
                               code="not_ready")
        return state.scheduler, state.tokenizer

    async def _start(prompt: list[int], params: Any) -> tuple[Sequence, asyncio.Queue[dict[str, Any]]]:
        sched, _ = _engine()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def sink(ev: dict[str, Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, ev)

        seq = Sequence(prompt=prompt, params=params, sink=sink)
        try:
            sched.submit(seq)
        except QueueFull as e:
            raise RequestError(str(e), status=429, type_="rate_limit_exceeded", code="queue_full") from None
        except RuntimeError as e:
            raise RequestError(str(e), status=503, type_="server_error", code="engine_failed") from None
        return seq, queue

    async def _events(seq: Sequence, queue: asyncio.Queue[dict[str, Any]],
                      request: Request | None = None) -> AsyncIterator[dict[str, Any]]:
        watcher = None
        if request is not None:
            # Not streaming: nothing is sent until the end, so watch for the client leaving and
            # stop generating for it then (a stream notices at its next write).
            async def watch() -> None:
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                queue.put_nowait({"type": "gone"})

            watcher = asyncio.get_running_loop().create_task(watch())
        finished = False
        try:
            while True:
                ev = await queue.get()
                if ev["type"] == "gone":
                    return
                yield ev
                if ev["type"] in ("finish", "error"):
                    finished = True
                    return
        finally:
            if watcher is not None:
                watcher.cancel()
            if not finished and state.scheduler is not None:
                state.scheduler.abort(seq.id)

    def _chat_logprobs(tok: ChatTokenizer, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for e in entries:
            t = tok.id_to_token(e["id"])
            out.append({"token": t, "logprob": e["logprob"], "bytes": list(t.encode()),
                        "top_logprobs": [{"token": (s := tok.id_to_token(i)), "logprob": lp,
                                          "bytes": list(s.encode())} for i, lp in e["top"]]})
        return out

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await _body(request)
        messages = chat_messages(body)
        params = sampling_params(body, chat=True)
        tools = tools_of(body)
        _, tok = _engine()
        try:
            prompt_text = tok.render(messages, tools)
        except Exception as e:
            raise RequestError(f"the chat template could not render these messages: {e}", "messages") from None
        prompt = tok.encode(prompt_text)
        check_length(len(prompt), params, state.max_model_len, "messages")
        seq, queue = await _start(prompt, params)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = body.get("model") or state.model_name
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_chat_stream(tok, seq, queue, rid, created, model, bool(tools),
                                                  include_usage, params.logprobs),
                                     media_type="text/event-stream")
        text, lps, reason, usage = "", [], "stop", {}
        async for ev in _events(seq, queue, request):
            if ev["type"] == "delta":
                text += ev["text"]
                lps.extend(ev.get("logprobs", []))
            elif ev["type"] == "finish":
                reason, usage = ev["reason"], ev["usage"]
            else:
                return JSONResponse({"error": {"message": ev["message"], "type": "server_error", "param": None,
                                               "code": "engine_failed"}}, status_code=500)
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if tools:
            content, calls = parse_tool_calls(text)
            if calls:
                msg = {"role": "assistant", "content": content, "tool_calls": calls}
                reason = "tool_calls"
        choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": reason,
                                  "logprobs": {"content": _chat_logprobs(tok, lps)} if params.logprobs else None}
        return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": model,
                             "choices": [choice], "usage": usage})

    async def _chat_stream(tok: ChatTokenizer, seq: Sequence, queue: asyncio.Queue[dict[str, Any]], rid: str,
                           created: int, model: str, tools: bool, include_usage: bool,
                           logprobs: bool) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None, lp: list[dict[str, Any]] | None = None,
                  ) -> bytes:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            if logprobs:
                choice["logprobs"] = {"content": lp or []}
            obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [choice]}
            return b"data: " + _json(obj) + b"\n\n"

        yield chunk({"role": "assistant", "content": ""})
        buffered, buffered_lp = "", []
        async for ev in _events(seq, queue):
            if ev["type"] == "delta":
                lp = _chat_logprobs(tok, ev.get("logprobs", [])) if logprobs else None
                if tools:  # tool JSON is parsed once complete, so hold the text back
                    buffered += ev["text"]
                    buffered_lp.extend(lp or [])
                elif ev["text"] or lp:
                    yield chunk({"content": ev["text"]}, lp=lp)
            elif ev["type"] == "finish":
                reason = ev["reason"]
                if tools:
                    content, calls = parse_tool_calls(buffered)
                    if calls:
                        reason = "tool_calls"
                        if content:
                            yield chunk({"content": content}, lp=buffered_lp)
                        yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
                    elif buffered:
                        yield chunk({"content": buffered}, lp=buffered_lp)
                yield chunk({}, reason)
                if include_usage:
                    yield b"data: " + _json({"id": rid, "object": "chat.completion.chunk", "created": created,
                                             "model": model, "choices": [], "usage": ev["usage"]}) + b"\n\n"
                yield b"data: [DONE]\n\n"
            else:
                yield b"data: " + _json({"error": {"message": ev["message"], "type": "server_error",
                                                   "param": None, "code": "engine_failed"}}) + b"\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _body(request)
        params = sampling_params(body, chat=False)
        if body.get("max_tokens") is None:
            params.max_tokens = 16
        _, tok = _engine()
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
            p = p[0]
        if isinstance(p, str) and p:
            prompt = tok.encode(p)
        elif isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool) for i in p):
            prompt = list(p)
            if any(i < 0 or i >= tok.vocab_size for i in prompt):
                raise RequestError("prompt token id out of range", "prompt")
        else:
            raise RequestError("'prompt' must be a non-empty string or a list of token ids", "prompt")
        check_length(len(prompt), params, state.max_model_len, "prompt")
        seq, queue = await _start(prompt, params)
        rid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = body.get("model") or state.model_name

        def lp_obj(entries: list[dict[str, Any]], offset: int) -> dict[str, Any] | None:
            if not params.logprobs:
                return None
            toks = [tok.id_to_token(e["id"]) for e in entries]
            offsets, o = [], offset
            for t in toks:
                offsets.append(o)
                o += len(t)
            return {"tokens": toks, "token_logprobs": [e["logprob"] for e in entries],
                    "top_logprobs": [{tok.id_to_token(i): lp for i, lp in e["top"]} for e in entries],
                    "text_offset": offsets}

        if body.get("stream"):
            async def gen() -> AsyncIterator[bytes]:
                offset = 0
                async for ev in _events(seq, queue):
                    if ev["type"] == "delta":
                        c = {"index": 0, "text": ev["text"], "finish_reason": None,
                             "logprobs": lp_obj(ev.get("logprobs", []), offset)}
                        offset += len(ev["text"])
                        yield b"data: " + _json({"id": rid, "object": "text_completion", "created": created,
                                                 "model": model, "choices": [c]}) + b"\n\n"
                    elif ev["type"] == "finish":
                        c = {"index": 0, "text": "", "finish_reason": ev["reason"], "logprobs": None}
                        obj: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created,
                                               "model": model, "choices": [c]}
                        if (body.get("stream_options") or {}).get("include_usage"):
                            obj["usage"] = ev["usage"]
                        yield b"data: " + _json(obj) + b"\n\n"
                        yield b"data: [DONE]\n\n"
                    else:
                        yield b"data: " + _json({"error": {"message": ev["message"], "type": "server_error",
                                                           "param": None, "code": "engine_failed"}}) + b"\n\n"
            return StreamingResponse(gen(), media_type="text/event-stream")
        text, lps, reason, usage = "", [], "stop", {}
        async for ev in _events(seq, queue, request):
            if ev["type"] == "delta":
                text += ev["text"]
                lps.extend(ev.get("logprobs", []))
            elif ev["type"] == "finish":
                reason, usage = ev["reason"], ev["usage"]
            else:
                return JSONResponse({"error": {"message": ev["message"], "type": "server_error", "param": None,
                                               "code": "engine_failed"}}, status_code=500)
        return JSONResponse({"id": rid, "object": "text_completion", "created": created, "model": model,
                             "choices": [{"index": 0, "text": text, "finish_reason": reason,
                                          "logprobs": lp_obj(lps, 0)}], "usage": usage})

    return app
