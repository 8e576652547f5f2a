"""Send a routed request upstream: pick a replica, retry on another before the first byte, fall back.

Returns the upstream's answer as bytes (non-streaming) or as an open stream whose first
chunk has already arrived (so a replica that dies before its first byte is retried).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import orjson

from switchyard import errors
from switchyard.policy.rules import RouteDecision
from switchyard.pools import fit
from switchyard.pools.affinity import prefix_key
from switchyard.pools.answers import (
    DEFAULT_MAX_BODY,
    BodyTooLarge,
    ScrubbedStream,
    content_type,
    error_of,
    read_capped,
    scrubber_for,
    shown_type,
    stream_error_of,
    undecodable,
)
from switchyard.pools.pool import NoCapacity, NoHealthyReplica, Pool, release
from switchyard.pools.replica import Replica
from switchyard.state.base import CircuitRecord, StateStore

log = logging.getLogger("switchyard.dispatch")

# SWITCHYARD_UPSTREAM_CLIENT=aiohttp sends the request path through aiohttp, as before pools/upstream.py
# (a way back, and the A side of a measurement in one tree).
AIOHTTP_UPSTREAM = os.environ.get("SWITCHYARD_UPSTREAM_CLIENT", "").lower() == "aiohttp"
RETRIABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# Answers a client must not see as they are: an upstream's 401/403 is about the gateway's own
# credentials (its body may name our upstream key), and 5xx bodies carry internals (a database
# URL with its password was seen in one). The client gets a generic 502 with a request id; the
# detail goes to the log under that id.
HIDDEN_STATUS = frozenset({401, 403})
MAX_ERROR_BODY = 64 * 1024
# Failures every replica would repeat: refused credentials, an answer over the size limit.
NO_RETRY_CODES = frozenset({"upstream_auth_failed", "upstream_answer_too_large"})


@dataclass(eq=False)
class Answer:
    pool: str
    replica: Replica
    status: int
    content_type: str
    t_sent: float  # perf_counter when the successful attempt was sent
    t_first: float  # ... when its first bytes arrived (the whole body, when not streaming)
    attempts: int
    body: bytes = b""
    stream: aiohttp.ClientResponse | None = None
    first: bytes = b""
    usage_added: bool = False  # the gateway asked for usage in this stream; the client did not
    native: bool = False  # the client's own API body went upstream (NativeRequest): relay it untouched

    def finish(self, outcome: str, reason: str = "", state: StateStore | None = None) -> None:
        """A stream ended (ok | client_gone | upstream_failed): free the replica's slot."""
        if self.stream is not None:
            if outcome == "ok":
                self.stream.release()
            else:
                self.stream.close()  # closes the connection: the upstream sees the client go
            self.stream = None
        if outcome == "ok":
            self.replica.breaker.on_success()
        elif outcome == "upstream_failed":
            _record_failure(self.replica, reason, state)
        else:
            self.replica.breaker.trial_in_flight = False  # a client leaving says nothing of the replica
        release(self.replica)


@dataclass(frozen=True, slots=True)
class NativeRequest:
    """The client's request in its own API (Responses, Messages), for pools whose replicas serve
    that API themselves (their spec's `api`); other pools get the normalised chat body."""

    api: str
    body: dict
    path: str  # under the replica's URL: /responses, /messages


def _request_id() -> str:
    return "req_" + uuid.uuid4().hex[:20]


def _record_failure(replica: Replica, reason: str, state: StateStore | None) -> None:
    replica.failures += 1
    if replica.breaker.on_failure(reason, time.monotonic()):
        log.warning("circuit opened for replica %s: %s", replica.name, reason)
        if state is not None:
            rec = CircuitRecord("open", time.time() + replica.breaker.cooldown, reason)
            task = asyncio.ensure_future(state.put_circuit(replica.url, rec))
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)


class AttemptSpan(Protocol):
    """One upstream attempt as a trace sees it (gateway/tracing.py)."""

    headers: dict[str, str]  # sent upstream besides the pool's own (W3C traceparent)

    def end(self, status: int | None, error: str) -> None: ...


class AttemptTrace(Protocol):
    def attempt(self, pool: str, replica: Replica, n: int, waited: float) -> AttemptSpan: ...


class ForwardedTraceContext:
    """Tracing off: the client's own `traceparent` (and `tracestate`) go upstream as they came,
    so the upstream's spans still join the client's trace."""

    __slots__ = ("headers",)

    def __init__(self, headers: dict[str, str]):
        self.headers = headers

    def attempt(self, pool: str, replica: Replica, n: int, waited: float) -> ForwardedTraceContext:
        return self

    def end(self, status: int | None, error: str) -> None:
        return None


class DispatchEvents(Protocol):
    """What the dispatcher reports as it goes (the gateway's metrics implement it)."""

    def retried(self, pool: str) -> None: ...

    def fell_back(self, src: str, dst: str) -> None: ...

    def upstream_failed(self, pool: str, replica: str, reason: str) -> None: ...


class Dispatcher:
    def __init__(self, events: DispatchEvents, state: StateStore, max_body: int = DEFAULT_MAX_BODY):
        self.events = events
        self.state = state
        self.max_body = max_body  # largest non-stream answer taken from an upstream (--max-upstream-body)

    async def send(
        self, pools: Mapping[str, Pool], decision: RouteDecision, body: dict, path: str, stream: bool,
        trace: AttemptTrace | None = None, native: NativeRequest | None = None, size: int | None = None,
    ) -> Answer:
        """Send to the decision's pool (its pinned replica first), retrying on other replicas
        before the first byte, then along its fallback chain. Raises a switchyard.errors error.
        `trace` sees each attempt (a span, and the headers that carry it upstream). `native`: a
        pool that lists its API gets it untranslated instead of `body` (decided per pool, so a
        fallback to a pool of another kind still works); prefix keys always come from `body`. `size`:
        the body's bytes as the client sent them, when `body` is that body (the window estimate)."""
        # Only the pools whose context window the prompt fits, each with the max_tokens it leaves.
        fits = fit.plan(pools, (decision.pool, *decision.fallbacks), body, size)
        capacity: NoCapacity | None = None
        failure: errors.RequestError | None = None
        attempts = 0
        prev = decision.pool if fits.chain[0][0] != decision.pool else None
        had_options = "stream_options" in body
        client_options = body.get("stream_options")
        client_asked = isinstance(client_options, dict) and client_options.get("include_usage") is True
        for pname, room in fits.chain:
            pool = pools.get(pname)
            if pool is None:
                continue
            if prev is not None:
                self.events.fell_back(prev, pname)
            prev = pname
            body["model"] = pool.model
            fits.apply(body, room)
            add_usage = stream and not client_asked and pool.spec.stream_usage
            if add_usage:  # token counts and cost need the stream's usage
                extra = client_options if isinstance(client_options, dict) else {}
                body["stream_options"] = {**extra, "include_usage": True}
            elif stream and body.get("stream_options") is not client_options:  # a fallback pool that opted out
                if had_options:
                    body["stream_options"] = client_options
                else:
                    del body["stream_options"]
            sent_native = native is not None and native.api in pool.spec.api
            if sent_native:
                assert native is not None
                native.body["model"] = pool.model
                fits.apply(native.body, room)
                payload, upath = orjson.dumps(native.body), native.path
            else:
                payload, upath = orjson.dumps(body), path
            tried: set[Replica] = set()
            prefer = decision.replica if pname == decision.pool else None
            affinity = prefix_key(body) if pool.spec.strategy == "cache_aware" else None
            for attempt in range(pool.spec.retries + 1):
                t_wait = time.perf_counter() if trace is not None else 0.0
                try:  # a free slot at once, else the pool's queue
                    replica = pool.try_acquire(tried, prefer, affinity) or await pool.acquire(tried, prefer, affinity)
                except NoHealthyReplica:
                    failure = failure or errors.Unavailable(f"pool {pname!r} has no healthy replica")
                    break
                except NoCapacity as e:
                    capacity = e
                    break
                if attempt:
                    self.events.retried(pname)
                attempts += 1
                tried.add(replica)
                if trace is None:
                    answer, failure = await self._attempt(pool, replica, upath, payload, stream, attempts)
                else:
                    answer, failure = await self._traced(trace, pool, replica, upath, payload, stream, attempts,
                                                         time.perf_counter() - t_wait)
                if answer is not None:
                    answer.usage_added = add_usage and not sent_native
                    answer.native = sent_native
                    return answer
                if isinstance(failure, errors.UpstreamTimeout) or (failure and failure.code in NO_RETRY_CODES):
                    # The upstream took the request and did not answer in time: trying again
                    # elsewhere would double the client's wait; retries are for quick failures.
                    # Refused credentials would be refused by every replica alike.
                    raise failure
        if failure is not None and capacity is None:
            raise failure
        if capacity is not None:
            raise errors.NoCapacity(
                f"no capacity: every replica of pool {capacity.pool!r} is busy and its queue is full or timed out",
                capacity.retry_after,
            )
        raise failure or errors.Unavailable("no pool could take the request")

    async def _traced(
        self, trace: AttemptTrace, pool: Pool, replica: Replica, path: str, payload: bytes, stream: bool,
        attempts: int, waited: float,
    ) -> tuple[Answer | None, errors.RequestError | None]:
        span = trace.attempt(pool.name, replica, attempts, waited)
        headers = {**pool.upstream_headers, **span.headers}
        try:
            answer, failure = await self._attempt(pool, replica, path, payload, stream, attempts, headers)
        except BaseException as e:
            span.end(None, f"cancelled: {type(e).__name__}")
            raise
        if answer is not None:
            span.end(answer.status, f"HTTP {answer.status}" if answer.status >= 400 else "")
        else:
            span.end(None, failure.message if failure is not None else "failed")
        return answer, failure

    async def _attempt(
        self, pool: Pool, replica: Replica, path: str, payload: bytes, stream: bool, attempts: int,
        headers: dict[str, str] | None = None,
    ) -> tuple[Answer | None, errors.RequestError | None]:
        t_sent = time.perf_counter()
        resp: aiohttp.ClientResponse | None = None
        try:
            sent = headers or pool.upstream_headers
            # Redirects are never followed: a 307 would re-send the body (and our key) anywhere.
            # A pool's Bearer key wins over a replica URL's user:password (one Authorization header).
            if AIOHTTP_UPSTREAM:
                resp = await replica.client().post(
                    replica.url + path, data=payload, headers=sent, timeout=pool.timeout, allow_redirects=False,
                    auth=None if "Authorization" in sent else replica.auth,
                )
            else:  # the request path's own client (pools/upstream.py): same surface, same errors
                spec = pool.spec
                resp = await replica.upstream().post(path, payload, sent, spec.timeout, spec.connect_timeout,
                                                     replica.auth)
            status = resp.status
            if sent is pool.upstream_headers:  # the pool's own headers: its scrubber made once a replica
                cached = replica.scrubber
                if cached is None or cached[0] is not sent or cached[1] is not replica.auth:
                    cached = replica.scrubber = (sent, replica.auth, scrubber_for(sent, replica.auth))
                scrub = cached[2]
            else:
                scrub = scrubber_for(sent, replica.auth)
            if 300 <= status < 400:
                resp.close()
                return None, self._failed(pool, replica, f"HTTP {status} (redirects are not followed)",
                                          scrub.bytes(resp.headers.get("Location", "")[:200].encode()).decode(), 502)
            if status in RETRIABLE_STATUS or status in HIDDEN_STATUS or status >= 500:
                raw = scrub.bytes(await resp.content.read(MAX_ERROR_BODY))
                detail = raw.decode("utf-8", "replace")[:300]
                resp.close()
                if status in HIDDEN_STATUS:  # the replica is up; our credentials are wrong: no retry
                    replica.breaker.on_success()
                    release(replica)
                    return None, self._hidden(pool, replica, status, detail)
                return None, self._failed(pool, replica, f"HTTP {status}", detail,
                                          status if status in RETRIABLE_STATUS else 502)
            raw_type = resp.headers.get("Content-Type")
            ctype = content_type(raw_type)
            if ctype is None:  # an HTML error page, a script: never served on our origin
                resp.close()
                return None, self._failed(pool, replica, f"HTTP {status} with Content-Type {shown_type(raw_type)!r}",
                                          "", 502)
            enc = undecodable(resp)
            if enc is not None:
                resp.close()
                return None, self._failed(pool, replica, f"HTTP {status} with Content-Encoding {enc!r}", "", 502)
            if stream and status == 200:
                first = await resp.content.readany()
                if not first:
                    resp.close()
                    return None, self._failed(pool, replica, "empty stream", "", 502)
                err = stream_error_of(first)
                if err is not None:  # an error dressed as an answer: retry, fall back, count it
                    resp.close()
                    return None, self._failed(pool, replica, "HTTP 200 whose stream is an error",
                                              scrub.bytes(err.encode()).decode(), 502)
                t_first = time.perf_counter()
                replica.observe_latency((t_first - t_sent) * 1000)
                replica.requests += 1
                upstream: aiohttp.ClientResponse = resp
                if scrub:
                    first = scrub.bytes(first)
                    upstream = ScrubbedStream(resp, scrub)  # type: ignore[assignment]
                return Answer(pool.name, replica, status, ctype, t_sent, t_first, attempts,
                              stream=upstream, first=first), None
            try:
                data = await read_capped(resp, self.max_body)
            except BodyTooLarge as e:
                resp.close()
                failed = self._failed(pool, replica, f"answer over the limit of {e.limit:,} bytes "
                                      "(--max-upstream-body)", "", 502)
                failed.code = "upstream_answer_too_large"
                return None, failed
            resp.release()
            if scrub:
                data = scrub.bytes(data)
            if status < 300:
                err = error_of(data)
                if err is not None:
                    return None, self._failed(pool, replica, f"HTTP {status} whose body is an error", err, 502)
            t_first = time.perf_counter()
            replica.requests += 1
            if status < 500:
                replica.breaker.on_success()
                replica.observe_latency((t_first - t_sent) * 1000)
            release(replica)
            return Answer(pool.name, replica, status, ctype, t_sent, t_first, attempts, body=data), None
        except asyncio.CancelledError:
            if resp is not None:
                resp.close()
            release(replica)
            raise
        except TimeoutError as e:  # before OSError: TimeoutError is one
            if resp is not None:
                resp.close()
            if isinstance(e, aiohttp.ConnectionTimeoutError):  # never reached it: retriable
                return None, self._failed(pool, replica, "connect timeout", str(e), 502)
            return None, self._failed(pool, replica, "timeout", f"no answer within {pool.spec.timeout:g}s", 504)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as e:
            if resp is not None:
                resp.close()
            return None, self._failed(pool, replica, type(e).__name__, str(e), 502)
        except aiohttp.ClientError as e:
            if resp is not None:
                resp.close()
            return None, self._failed(pool, replica, type(e).__name__, str(e), 502)

    def _failed(self, pool: Pool, replica: Replica, reason: str, detail: str, status: int) -> errors.RequestError:
        self.events.upstream_failed(pool.name, replica.name, reason)
        _record_failure(replica, reason, self.state)  # /health shows the reason, never the upstream's text
        release(replica)
        rid = _request_id()
        log.warning("%s: upstream %s of pool %r failed: %s%s", rid, replica.name, pool.name, reason,
                    f": {detail}" if detail else "")
        msg = f"upstream {replica.name} of pool {pool.name!r} failed: {reason} (request id {rid})"
        if status == 504:
            return errors.UpstreamTimeout(msg)
        if status == 429:
            return errors.NoCapacity(msg, 1.0, "upstream_rate_limited")
        return errors.UpstreamFailed(msg)

    def _hidden(self, pool: Pool, replica: Replica, status: int, detail: str) -> errors.RequestError:
        self.events.upstream_failed(pool.name, replica.name, f"HTTP {status}")
        rid = _request_id()
        log.error("%s: upstream %s of pool %r refused the gateway's credentials: HTTP %d: %s", rid, replica.name,
                  pool.name, status, detail)
        return errors.UpstreamFailed(
            f"upstream {replica.name} of pool {pool.name!r} refused the gateway's credentials (HTTP {status}); "
            f"the operator can find the detail under request id {rid}", code="upstream_auth_failed")
