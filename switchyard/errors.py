"""Errors shared by every layer: plain exceptions, no HTTP in them.

Each says what went wrong in words a client or a policy author can act on, with the OpenAI
error `type` and `code` it maps to. Only the HTTP edge (`api/errors.py`) turns them into
responses: status codes and headers live there, as Starlette and httpx keep their errors free
of responses.
"""

from __future__ import annotations

from dataclasses import dataclass


class RequestError(Exception):
    """A request the gateway will not serve, and why."""

    type = "invalid_request_error"
    default_code: str | None = None

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code


class BadRequest(RequestError):
    """The request is malformed or names something that cannot work."""


class Unauthorized(RequestError):
    default_code = "invalid_api_key"


class Forbidden(RequestError):
    type = "permission_error"


class NotFound(RequestError):
    default_code = "model_not_found"


class MethodNotAllowed(RequestError):
    default_code = "method_not_allowed"


class RequestTimeout(RequestError):
    """The client took too long to send its request."""

    default_code = "request_timeout"


class TooLarge(RequestError):
    default_code = "request_too_large"

    def __init__(self, limit: int, what: str = "request body") -> None:
        super().__init__(f"{what} is larger than {limit} bytes")
        self.limit = limit


class ContextTooLong(BadRequest):
    """The prompt does not fit the context window of any pool the request may go to.

    `prompt_tokens` is the gateway's estimate (pools/fit.py), `limit` the largest window among those
    pools, `completion` the room it keeps for an answer. `message` is OpenAI's wording; the Messages
    dialect says Anthropic's, `anthropic_message`."""

    default_code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, limit: int, completion: int = 0) -> None:
        # "N tokens > M" is there for dialects that reword it (Anthropic: "prompt is too long: N tokens > M maximum").
        super().__init__(
            f"This model's maximum context length is {limit} tokens. However, your messages resulted in about "
            f"{prompt_tokens} tokens (the gateway's estimate; {prompt_tokens} tokens > {limit - completion}, the "
            f"window less {completion} tokens kept for the answer). Please reduce the length of the messages.",
            "messages")
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        self.completion = completion

    @property
    def anthropic_message(self) -> str:
        return f"prompt is too long: {self.prompt_tokens} tokens > {self.limit - self.completion} maximum"


class RateLimited(RequestError):
    """An API key is over its requests or tokens per minute."""

    type = "requests"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, kind: str, limit: int, reset_s: float) -> None:
        super().__init__(message)
        self.type = kind  # OpenAI names the exhausted budget: requests | tokens
        self.kind = kind
        self.limit = limit
        self.reset_s = reset_s


class NoCapacity(RequestError):
    """Every replica is busy and the queue is full or timed out."""

    type = "rate_limit_error"
    default_code = "no_capacity"

    def __init__(self, message: str, retry_after: float, code: str | None = None) -> None:
        super().__init__(message, None, code)
        self.retry_after = retry_after


class Unavailable(RequestError):
    type = "service_unavailable"
    default_code = "no_healthy_replica"


class UpstreamFailed(RequestError):
    type = "upstream_error"
    default_code = "upstream_error"


class UpstreamTimeout(RequestError):
    type = "upstream_error"
    default_code = "upstream_timeout"


class ClassifierLoadError(Exception):
    """A classifier cannot be built: missing, corrupt or mismatched model file, bad settings.

    The message is written for the person editing the policy; the gateway shows it as a
    policy-load error and keeps serving the previous policy.
    """


@dataclass(frozen=True)
class PolicyIssue:
    """One problem in a policy file. `path` locates it in the document (("routes", 2, "when",
    "text")); the loader turns it into `line`, so no layer parses a message to find a line."""

    file: str
    line: int
    reason: str
    path: tuple[str | int, ...] = ()

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


class PolicyError(Exception):
    """A policy that cannot be used. `issues` holds every problem found, each with its line."""

    def __init__(self, issues: list[PolicyIssue]):
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))
