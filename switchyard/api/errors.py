"""Errors in OpenAI's envelope: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import orjson
from starlette.responses import Response


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self, extra_headers: dict[str, str] | None = None) -> Response:
        headers = dict(self.headers)
        if extra_headers:
            headers.update(extra_headers)
        return Response(self.body(), self.status, headers=headers, media_type="application/json")


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def not_found(message: str, param: str | None = None, code: str | None = "model_not_found") -> APIError:
    return APIError(404, message, "invalid_request_error", param, code)


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than {limit} bytes", "invalid_request_error", None, "request_too_large")


def no_capacity(message: str, retry_after: float) -> APIError:
    return APIError(
        429, message, "rate_limit_error", None, "no_capacity", {"Retry-After": str(max(1, round(retry_after)))}
    )


def bad_gateway(message: str, code: str = "upstream_error") -> APIError:
    return APIError(502, message, "upstream_error", None, code)


def gateway_timeout(message: str) -> APIError:
    return APIError(504, message, "upstream_error", None, "upstream_timeout")


def unavailable(message: str, code: str = "no_healthy_replica") -> APIError:
    return APIError(503, message, "service_unavailable", None, code, {"Retry-After": "1"})


def sse_error_event(message: str, code: str = "upstream_error") -> bytes:
    """A stream that breaks after its first byte ends with this event: the OpenAI SDK raises on it."""
    return b"data: " + error_body(message, "upstream_error", None, code) + b"\n\n"
