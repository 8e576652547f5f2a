"""The HTTP edge's side of errors: a `switchyard.errors` exception -> OpenAI's envelope,
{"error": {"message", "type", "param", "code"}}, with its status and headers."""

from __future__ import annotations

from typing import Protocol

import orjson
from starlette.responses import Response

from switchyard import errors as e

JSON = "application/json"


class ErrorShape(Protocol):
    """A client API's errors (api/dialect.py's Dialect): its body, and optionally its own status
    for a gateway error (`status(status, type, code)`: Anthropic answers 529 where OpenAI says 429)."""

    def error_body(self, status: int, kind: str, message: str, param: str | None, code: str | None) -> bytes: ...


def status_in(shape: ErrorShape | None, status: int, kind: str, code: str | None) -> int:
    restatus = getattr(shape, "status", None)
    return status if restatus is None else restatus(status, kind, code)


# Most specific first: the first class an error is an instance of gives its status.
STATUS: tuple[tuple[type[e.RequestError], int], ...] = (
    (e.TooLarge, 413),
    (e.RequestTimeout, 408),
    (e.Unauthorized, 401),
    (e.Forbidden, 403),
    (e.NotFound, 404),
    (e.MethodNotAllowed, 405),
    (e.RateLimited, 429),
    (e.NoCapacity, 429),
    (e.Unavailable, 503),
    (e.UpstreamTimeout, 504),
    (e.UpstreamFailed, 502),
    (e.BadRequest, 400),
)


def status_of(err: e.RequestError) -> int:
    for cls, status in STATUS:
        if isinstance(err, cls):
            return status
    return 400


def headers_of(err: e.RequestError) -> dict[str, str]:
    if isinstance(err, e.RateLimited):
        return {
            "Retry-After": str(max(1, int(err.reset_s + 0.999))),
            f"x-ratelimit-limit-{err.kind}": str(err.limit),
            f"x-ratelimit-remaining-{err.kind}": "0",
            f"x-ratelimit-reset-{err.kind}": f"{err.reset_s:.0f}s",
        }
    if isinstance(err, e.NoCapacity):
        return {"Retry-After": str(max(1, round(err.retry_after)))}
    if isinstance(err, e.Unavailable):
        return {"Retry-After": "1"}
    return {}


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def response(err: e.RequestError, extra_headers: dict[str, str] | None = None,
             shape: ErrorShape | None = None) -> Response:
    """The error as a response: OpenAI's envelope, or the client API's own `shape` (its dialect)."""
    headers = headers_of(err)
    if extra_headers:
        headers.update(extra_headers)
    if shape is None:
        return Response(error_body(err.message, err.type, err.param, err.code), status_of(err), headers=headers,
                        media_type=JSON)
    status = status_in(shape, status_of(err), err.type, err.code)
    return Response(shape.error_body(status, err.type, err.message, err.param, err.code), status, headers=headers,
                    media_type=JSON)


def sse_error_event(message: str, code: str = "upstream_error") -> bytes:
    """A stream that breaks after its first byte ends with this event: the OpenAI SDK raises on it."""
    return b"data: " + error_body(message, "upstream_error", None, code) + b"\n\n"
