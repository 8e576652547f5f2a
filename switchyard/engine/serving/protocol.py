"""OpenAI request validation for the engine: plain dicts in, SamplingParams out, and the
OpenAI error envelope for anything a client got wrong."""

from __future__ import annotations

from typing import Any

from switchyard.engine.core.sampling import SamplingParams
from switchyard.engine.errors import RequestError

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float,
            lo_open: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RequestError(f"'{key}' must be a number, got {v!r}", key)
    if v < lo or v > hi or (lo_open and v == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise RequestError(f"'{key}' must be in {bound}, got {v}", key)
    return float(v)


def _int(body: dict[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"'{key}' must be an integer, got {v!r}", key)
    if v < lo or (hi is not None and v > hi):
        raise RequestError(f"'{key}' must be between {lo} and {hi if hi is not None else 'the context length'}, "
                           f"got {v}", key)
    return v


def sampling_params(body: dict[str, Any], chat: bool) -> SamplingParams:
    n = _int(body, "n", 1)
    if n not in (None, 1):
        raise RequestError("only n=1 is supported", "n")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    for k in ("presence_penalty", "frequency_penalty"):
        _number(body, k, 0.0, -2.0, 2.0)
    seed = _int(body, "seed", -(2**63))
    max_tokens = _int(body, "max_completion_tokens", 1) if chat else None
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop] if stop else []
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 16:
        stops = [s for s in stop if s]
    else:
        raise RequestError("'stop' must be a string or a list of up to 16 strings", "stop")
    logprobs = False
    top = 0
    if chat:
        lp = body.get("logprobs")
        if lp is not None and not isinstance(lp, bool):
            raise RequestError("'logprobs' must be a boolean", "logprobs")
        logprobs = bool(lp)
        t = _int(body, "top_logprobs", 0, 20)
        if t and not logprobs:
            raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        top = t or 0
    else:
        t = _int(body, "logprobs", 0, 20)
        if t is not None:
            logprobs, top = True, t
    return SamplingParams(max_tokens=max_tokens or 0, temperature=temperature, top_p=top_p, seed=seed,
                          stop=stops, logprobs=logprobs, top_logprobs=top,
                          ignore_eos=bool(body.get("ignore_eos", False)))


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("'messages' must be a non-empty list", "messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object", f"messages.{i}")
        role = m.get("role")
        if role not in _ROLES:
            raise RequestError(f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}",
                               f"messages.{i}.role")
        c = m.get("content")
        if c is not None and not isinstance(c, str | list):
            raise RequestError(f"messages[{i}].content must be a string or a list of parts",
                               f"messages.{i}.content")
        if role == "developer":
            m = dict(m)
    return [({**m, "role": "system"} if m.get("role") == "developer" else m) for m in msgs]


def tools_of(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RequestError("'tools' must be a list of objects", "tools")
    for i, t in enumerate(tools):
        fn = t.get("function", t)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"tools[{i}] needs function.name", f"tools.{i}")
    if body.get("tool_choice") == "none" or not tools:
        return None
    return tools


def check_length(prompt_len: int, params: SamplingParams, max_model_len: int, param: str) -> None:
    """Fill in max_tokens and refuse what cannot fit the context (vLLM's wording)."""
    if prompt_len >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input.", param,
            "context_length_exceeded")
    room = max_model_len - prompt_len
    if params.max_tokens == 0:
        params.max_tokens = room
    elif params.max_tokens > room:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + params.max_tokens} tokens ({prompt_len} in the input, {params.max_tokens} in "
            f"the completion). Please reduce the length of the input or the completion.", "max_tokens",
            "context_length_exceeded")
