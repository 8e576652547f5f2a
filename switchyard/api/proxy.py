"""The proxy endpoints: POST /v1/chat/completions, /v1/completions, /v1/responses and
/v1/messages, one code path for every client API (the endpoints that route without an upstream
call, /v1/route among them, are api/dry_run.py's).

One pass per request: parse once (orjson), let the route's dialect (api/dialect.py) turn the body
into the normalised Chat Completions request, route, send, relay. Chat and Completions are their
own normalised form: only `model` is rewritten, every other field goes upstream untouched and
the answer comes back byte for byte. Other APIs are translated to chat and back, unless the
chosen pool speaks the client's API itself (then the client's body goes there as it came). They
are answered by a pure ASGI middleware in front of FastAPI (api/fast_path.py: no router, no dependency
injection): it measured ~2x the requests/s of the same handlers as routes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from switchyard import errors
from switchyard.api import errors as http_errors
from switchyard.api.body import DEFAULT_LIMITS, BodyLimits, bounded, check_request, json_depth, parse_json
from switchyard.api.chat import CHAT, COMPLETIONS
from switchyard.api.dialect import Dialect, Parsed, StreamTranslator, chat_path
from switchyard.api.openai import decision_headers
from switchyard.api.relay import CONN_KEY, StreamRelay
from switchyard.api.replies import Answered, Translated
from switchyard.classify.features import Features, extract
from switchyard.gateway.auth import resolve_for
from switchyard.gateway.gateway import LoadedPolicy, Target
from switchyard.gateway.keys import KeyRecord
from switchyard.gateway.limits import Reservation, reserve_estimate
from switchyard.gateway.routing import Routed, session_id_of
from switchyard.gateway.runtime import Runtime
from switchyard.gateway.usage import MAX_EVENT_BYTES, UsageTap, parse_usage
from switchyard.policy.rules import RouteDecision
from switchyard.policy.schema import PriceSpec
from switchyard.pools.dispatch import Answer, AttemptTrace, ForwardedTraceContext, NativeRequest

if TYPE_CHECKING:  # imported by api/app.py only when tracing is on
    from switchyard.gateway.tracing import RequestTrace

log = logging.getLogger("switchyard.api")

JSON = "application/json"
SSE = "text/event-stream"
EMPTY_BODY = "the request body is empty; send a JSON object"
__all__ = ["Proxy", "json_depth", "parse_json"]  # parse_json: the UI's JSON bodies take it too


@dataclasses.dataclass(slots=True)
class Admission:
    """A key's admission of one request (gateway/auth.py): its token reservation, settled once
    when the request ends, however it ends."""

    key: KeyRecord | None = None
    reservation: Reservation | None = None
    prompt_tokens: int = 0  # counted from the parsed body (a chunked body has no Content-Length)

    def settle(self, rt: Runtime, tokens: int, estimated: bool) -> None:
        if self.key is not None and rt.auth is not None:
            rt.auth.settle(self.key, self.reservation, tokens, estimated)
            self.key = None  # once


class Proxy:
    def __init__(self, rt: Runtime, dialects: Mapping[str, Dialect] | None = None,
                 limits: BodyLimits = DEFAULT_LIMITS, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.rt = rt
        self.dialects = dict(dialects or {})  # POST path -> dialect, besides chat and completions
        self.limits = limits  # the work one body may cost (api/body.py)
        self.max_event_bytes = max_event_bytes  # one upstream SSE event at most
        # Replica URLs, health, errors and in-flight counts in /v1/route: the operator's (api/app.py
        # sets it as /health decides; without it, nobody's).
        self.show_details: Callable[[Mapping[str, str]], bool] = lambda headers: False

    def body_now(self, request: Request) -> bytes | None:
        """The whole body when the server already holds it (the edge guard's `whole`, api/guard.py:
        a small body arrives with its headers), without an await; None when it must be read."""
        whole = getattr(request.receive, "whole", None)
        raw = whole() if whole is not None else None
        if raw is not None and not raw:
            raise errors.BadRequest(EMPTY_BODY)
        return raw

    async def read_raw(self, request: Request) -> bytes:
        """The body's bytes. Its size and pace are bounded before it gets here (api/guard.py)."""
        raw = self.body_now(request)
        return raw if raw is not None else await self._receive_body(request)

    async def _receive_body(self, request: Request) -> bytes:
        """The body read piece by piece from `receive` (Starlette's body() goes through an async
        generator per request)."""
        receive = request.receive
        parts = []
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                raise ClientDisconnect()
            parts.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        raw = parts[0] if len(parts) == 1 else b"".join(parts)
        if not raw:
            raise errors.BadRequest(EMPTY_BODY)
        return raw

    async def read_json(self, request: Request) -> Any:
        """The body as JSON, its work bounded (api/body.py), off the loop when it is large."""
        limits = self.limits
        return await bounded(await self.read_raw(request), lambda r: parse_json(r, limits), limits)

    def target(self, model: str, key: KeyRecord | None = None) -> Target:
        t = resolve_for(self.rt.gateway, model, key)
        if t is None:
            raise errors.NotFound(
                f"the model {model!r} does not exist here; GET /v1/models lists policies, pools and upstream models",
                "model",
            )
        return t

    async def decide(self, request: Request, dialect: Dialect, key: KeyRecord | None,
                     trace: RequestTrace | None = None, adm: Admission | None = None) -> tuple[Parsed, Target, Routed]:
        headers, limits = request.headers, self.limits

        def parse(raw: bytes) -> tuple[Parsed, Features]:  # everything proportional to the body, in one place
            parsed = dialect.parse(parse_json(raw, limits), headers)
            check_request(parsed.chat, limits)
            return parsed, extract(parsed.chat, headers, text_cues=False)

        raw = self.body_now(request)  # no coroutine when the body came with its headers
        if raw is None:
            raw = await self._receive_body(request)
        parsed, features = await bounded(raw, parse, limits)
        body = parsed.chat
        if parsed.native is body:  # the client's own chat body: its size is known (pools/fit.py)
            parsed.size = len(raw)
        target = self.target(body["model"], key)
        if key is not None and adm is not None:  # before any classifier call or session write
            assert self.rt.auth is not None
            adm.prompt_tokens = features.prompt_tokens
            adm.reservation = self.rt.auth.admit_key(
                key, body["model"], target,
                reserve_estimate(features.prompt_tokens, body.get("max_completion_tokens") or body.get("max_tokens")))
            adm.key = key
        prepare = getattr(dialect, "prepare", None)  # a stateful API (Responses) loads what it refers to
        if prepare is not None:
            pools = target.policy.spec.pools
            native = any(parsed.api in pools[p].api for p in ((target.pool,) if target.pool else pools))
            n = len(body["messages"])
            await prepare(parsed, key.id if key else "", native)
            if len(body["messages"]) != n:  # a chain's history joined: rules and the classifier see it all
                check_request(body, limits)
                features = extract(body, headers, text_cues=False)
                if adm is not None and adm.key is not None:
                    adm.prompt_tokens = features.prompt_tokens
        sid = session_id_of(body, request.headers, parsed.session_hint)
        if trace is None:
            routed = await self.rt.gateway.route(target, features, body, sid, key.id if key else "")
        else:
            t_parsed = time.perf_counter()
            trace.mark_parsed(t_parsed)
            routed = await self.rt.gateway.route(target, features, body, sid, key.id if key else "")
            trace.mark_routed(t_parsed, time.perf_counter(), routed.decision, routed.classify_start,
                              routed.classifier_error)
        lab = routed.decision.label
        if lab.name and lab.kind not in ("session", "none"):
            self.rt.metrics.classifier_latency.labels(lab.kind).observe(lab.ms / 1000.0)
            if lab.kind == "fail-open":
                self.rt.metrics.classifier_fail_open.labels(routed.decision.policy).inc()
        return parsed, target, routed

    async def proxy(self, request: Request, dialect: Dialect, trace: RequestTrace | None = None) -> Response:
        rt = self.rt
        t0 = time.perf_counter()
        key = None
        err_shape = None if dialect is CHAT or dialect is COMPLETIONS else dialect
        adm = Admission()
        try:
            if rt.auth is not None:
                key = await rt.auth.authenticate(request.headers)
            parsed, target, routed = await self.decide(request, dialect, key, trace, adm)
            body = parsed.chat
            decision = routed.decision
            if key is not None:
                assert rt.auth is not None
                rt.auth.check_pool(key, body["model"], decision.pool)  # admitted already; the pool is routing's
                if key.pools is not None and decision.fallbacks:  # no fallback into a pool the key may not use
                    decision = dataclasses.replace(
                        decision, fallbacks=tuple(p for p in decision.fallbacks if p in key.pools))
        except errors.RequestError as e:
            adm.settle(rt, 0, True)
            rt.metrics.rejected.labels(str(http_errors.status_of(e))).inc()
            if trace is not None:
                trace.failed(http_errors.status_of(e), e.message)
            return http_errors.response(e, None, err_shape)
        except BaseException:
            adm.settle(rt, 0, True)
            raise
        lp = target.policy
        if rt.recorder is not None:
            rt.recorder.record(body, decision.session_id, routed.trace())
        stream = parsed.stream
        # The client's own body, for a pool whose replicas speak its API (pools/dispatch.py decides per pool).
        native = None if parsed.native is body else NativeRequest(parsed.api, parsed.native, dialect.native_path)
        headers = decision_headers(decision)
        if parsed.dropped:
            headers["x-switchyard-dropped-tools"] = ", ".join(parsed.dropped)
        # Tracing on: a span per attempt; off: the client's own trace context, if it sent one.
        attempts: AttemptTrace | None = trace
        if trace is not None:
            headers["x-switchyard-trace-id"] = trace.trace_id
        elif "traceparent" in request.headers:
            attempts = ForwardedTraceContext({k: request.headers[k] for k in ("traceparent", "tracestate")
                                              if k in request.headers})
        t_routed = time.perf_counter()
        # Watch for the client leaving while we wait upstream: it cancels this task, which
        # closes the upstream connection. Our server's connection says so itself (api/server.py:
        # no task a request); under another server, one watcher task does.
        me = asyncio.current_task()
        left: list[bool] = []
        conn = request.scope.get(CONN_KEY)
        watcher = None
        if conn is not None:
            conn.on_lost = _canceller(me, left)
        else:
            async def watch() -> None:
                await _client_gone(request)
                left.append(True)
                if me is not None:
                    me.cancel()

            watcher = asyncio.get_running_loop().create_task(watch())
        try:
            answer: Answer = await rt.gateway.dispatcher.send(lp.pools, decision, body, chat_path(parsed.api),
                                                              stream, attempts, native, parsed.size)
        except asyncio.CancelledError:
            if not left:
                raise
            me.uncancel()  # type: ignore[union-attr]
            adm.settle(rt, adm.prompt_tokens, True)  # the prompt went upstream
            rt.metrics.rejected.labels("499").inc()
            if trace is not None:
                trace.failed(499, "the client left before the upstream answered")
            return Response(status_code=499)
        except errors.RequestError as e:
            adm.settle(rt, 0, True)
            dt = time.perf_counter() - t0
            status = http_errors.status_of(e)
            rt.finished(decision, decision.pool, "-", status, dt, dt)
            if trace is not None:
                trace.failed(status, e.message)
            return http_errors.response(e, headers, err_shape)
        finally:
            if watcher is not None:
                watcher.cancel()
            else:
                conn.on_lost = None
        try:
            return await self._respond(answer, decision, lp, headers, t0, t_routed, key, request, trace,
                                       None if answer.native or err_shape is None else (dialect, parsed), adm,
                                       getattr(dialect, "native_stream_error", None) if answer.native else None)
        except BaseException:
            if answer.stream is not None:  # never leak a replica slot or an open upstream stream
                answer.finish("client_gone", "", rt.gateway.state)
            adm.settle(rt, adm.prompt_tokens, True)
            raise

    async def _respond(self, answer: Answer, decision: RouteDecision, lp: LoadedPolicy, headers: dict[str, str],
                       t0: float, t_routed: float, key: KeyRecord | None, request: Request,
                       trace: RequestTrace | None, translate: tuple[Dialect, Parsed] | None,
                       adm: Admission | None = None, native_error: Callable[[str], bytes] | None = None) -> Response:
        """The upstream's answer to the client: as it came, or (`translate`: a chat answer to a client
        of another API) rendered in the client's API."""
        rt = self.rt
        if trace is not None:
            trace.mark_relay(answer.t_first)
        adm = adm if adm is not None else Admission()
        if answer.pool != decision.pool:
            headers["x-switchyard-pool"] = answer.pool
            headers["x-switchyard-fallback-from"] = decision.pool
        headers["x-switchyard-replica"] = answer.replica.name
        if answer.attempts > 1:
            headers["x-switchyard-attempts"] = str(answer.attempts)
        if decision.session_id:
            if lp.spec.session.pin == "replica":
                await rt.gateway.remember_replica(decision, lp, answer.replica.url, key.id if key else "")
            state = rt.gateway.state
            if getattr(state, "shared", True):  # the next turn may come through another gateway
                await state.flush()
        price = lp.pools[answer.pool].spec.price if answer.pool in lp.pools else None
        if answer.stream is None:
            status, body, ctype = answer.status, answer.body, answer.content_type
            if translate is not None:  # rendered first: what it costs is the gateway's overhead too
                status, body = await self._rendered(answer, translate[0], translate[1], key)
                ctype = JSON
            # The usage is read before the answer leaves only when its cost is a header; the rest of
            # the accounting runs once the answer is written (Answered's `after`), off its latency.
            usage = parse_usage(answer.body) if answer.status < 400 and price is not None else None
            cost = None
            if usage is not None and price is not None:
                cost = price.cost(usage.prompt, usage.completion, usage.cached)
                headers["x-switchyard-cost-usd"] = f"{cost:.9f}"
            now = time.perf_counter()
            overhead = (answer.t_sent - t_routed) + (t_routed - t0) + (now - answer.t_first)
            headers["x-switchyard-overhead-ms"] = f"{overhead * 1000:.3f}"

            def account() -> None:
                used = usage
                if used is None and price is None and answer.status < 400:  # not read before the answer left
                    used = parse_usage(answer.body)
                rt.finished(decision, answer.pool, answer.replica.name, status, now - t0, overhead, used, cost)
                if trace is not None:
                    trace.answered(answer.pool, answer.replica.name, status, answer.attempts, used, cost)
                if answer.status >= 400:
                    adm.settle(rt, 0, True)
                elif used is None:
                    adm.settle(rt, adm.prompt_tokens, True)
                else:
                    adm.settle(rt, used.total, False)

            return Answered(body, status, headers, ctype, after=account)
        overhead = answer.t_sent - t0 + (time.perf_counter() - answer.t_first)
        headers["x-switchyard-overhead-ms"] = f"{overhead * 1000:.3f}"
        if price is not None:  # the cost is known only after the last byte: the prices, for the client's usage
            headers["x-switchyard-price"] = _price_header(price)
        headers["cache-control"] = "no-cache"
        headers["x-accel-buffering"] = "no"
        raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
        # Tokens come from the stream's tail (its usage), without parsing events; the usage event
        # the gateway asked for on the client's behalf is taken out (a translator reads it instead).
        tap = UsageTap(answer.stream, answer.usage_added and translate is None, self.max_event_bytes)
        first = tap.feed(answer.first)
        source: Any = tap
        error_event = http_errors.sse_error_event
        if translate is None:
            raw_headers.append((b"content-type", answer.content_type.encode()))
            if native_error is not None:  # a Responses / Messages stream passed through: its API's error event
                error_event = native_error
        else:
            dialect, parsed = translate
            translator = dialect.translator(parsed)
            assert translator is not None
            raw_headers.append((b"content-type", SSE.encode()))
            source = Translated(tap, translator, self._keeper(dialect, parsed, key, translator))
            first = translator.feed(first)
            error_event = translator.error

        def done(outcome: str, reason: str, sent: int) -> None:
            answer.finish(outcome, reason, rt.gateway.state)
            usage = tap.usage()
            cost = None if usage is None or price is None else price.cost(usage.prompt, usage.completion, usage.cached)
            if usage is None:  # the prompt and one token an event, however far the stream got
                adm.settle(rt, tap.estimate(adm.prompt_tokens), True)
            else:
                adm.settle(rt, usage.total, False)
            code = answer.status if outcome == "ok" else (499 if outcome == "client_gone" else 502)
            rt.finished(decision, answer.pool, answer.replica.name, code, time.perf_counter() - t0, overhead,
                        usage, cost)
            if trace is not None:
                trace.answered(answer.pool, answer.replica.name, code, answer.attempts, usage, cost)

        return StreamRelay(source, first, answer.status, raw_headers, done, answer.replica.name, error_event)

    async def _rendered(self, answer: Answer, dialect: Dialect, parsed: Parsed,
                        key: KeyRecord | None) -> tuple[int, bytes]:
        """A non-streaming chat answer rendered in the client's API (its errors in that API's shape):
        (status, body)."""
        if answer.status >= 400:
            return _error_in(dialect, answer.status, answer.body)
        try:
            chat_answer = orjson.loads(answer.body)
            if not isinstance(chat_answer, dict) or not isinstance(chat_answer.get("choices"), list):
                raise ValueError("not a chat.completion")
            out = dialect.render(chat_answer, parsed)
        except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, IndexError) as e:
            err = errors.UpstreamFailed(f"upstream {answer.replica.name} of pool {answer.pool!r} sent an answer "
                                        f"that is not a chat completion: {e}")
            status = http_errors.status_in(dialect, 502, err.type, err.code)
            return status, dialect.error_body(status, err.type, err.message, None, err.code)
        keep = getattr(dialect, "keep", None)  # a stateful API (Responses: store) keeps what it answered
        if keep is not None:
            await keep(parsed, key.id if key else "", out)
        return answer.status, orjson.dumps(out)

    def _keeper(self, dialect: Dialect, parsed: Parsed, key: KeyRecord | None,
                translator: StreamTranslator) -> Callable[[], Awaitable[None]] | None:
        """What a stream does after its last upstream byte and before its closing events go out
        (Responses: store the response, so a next turn through any gateway finds it)."""
        keep = getattr(dialect, "keep", None)
        if keep is None:
            return None
        caller = key.id if key else ""

        async def kept() -> None:
            result = getattr(translator, "result", None)
            if result is not None:
                await keep(parsed, caller, result)

        return kept


def _canceller(task: asyncio.Task | None, left: list[bool]) -> Callable[[], None]:
    def lost() -> None:
        left.append(True)
        if task is not None:
            task.cancel()

    return lost


def _error_in(dialect: Dialect, status: int, body: bytes) -> tuple[int, bytes]:
    """An upstream's error answer (OpenAI's envelope, as chat servers send it) in the client's API:
    (its status there, its body)."""
    try:
        err = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        err = None
    if not isinstance(err, dict):
        err = {"message": body[:300].decode("utf-8", "replace")}
    msg, kind = err.get("message"), str(err.get("type") or "invalid_request_error")
    code = err.get("code") if isinstance(err.get("code"), str) else None
    status = http_errors.status_in(dialect, status, kind, code)
    return status, dialect.error_body(status, kind, msg if isinstance(msg, str) else "the upstream refused the request",
                                      err.get("param") if isinstance(err.get("param"), str) else None, code)


def _price_header(p: PriceSpec) -> str:
    cached = p.prompt if p.cached is None else p.cached
    return f"prompt={p.prompt:g}; completion={p.completion:g}; cached={cached:g}; unit=USD per 1M tokens"


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return
