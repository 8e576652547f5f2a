"""The engine's exceptions, one tree under EngineError; no HTTP in them but the status a
request error maps to (serving/http.py turns them into OpenAI error bodies).

Each also derives from the builtin its callers caught before (ValueError, LookupError,
RuntimeError), and a request error from switchyard.errors.RequestError (message, param, code),
so code outside the engine that catches those keeps working.
"""

from __future__ import annotations

from typing import Any

from switchyard import errors


class EngineError(Exception):
    """Anything the engine raises on purpose."""


class ConfigError(EngineError, ValueError):
    """Options or a model file the engine cannot serve (before anything runs)."""


class ModelNotFound(EngineError, LookupError):
    """A model name that is neither a path nor a known (pulled) model."""


class RequestError(EngineError, errors.RequestError):
    """A request the engine will not serve, with the HTTP status and OpenAI error type it maps to."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int = 400, type_: str = "invalid_request_error") -> None:
        errors.RequestError.__init__(self, message, param, code)
        self.status, self.type = status, type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class GrammarError(EngineError, ValueError):
    """A grammar (a schema of the request) llguidance cannot compile; `param` names its source."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


class QueueFull(EngineError, RuntimeError):
    """The waiting queue is at --max-waiting: the request is refused (429), not queued."""


class EngineFailed(EngineError, RuntimeError):
    """The engine stopped (fail-stop after a collective or kernel failure): nothing more runs."""


class KernelError(EngineError, RuntimeError):
    """A native or Triton kernel returned an error code (unsupported shape, out of memory, ...)."""
