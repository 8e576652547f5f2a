"""JSONL traces: one OpenAI chat request per line, plus replay fields.

    {"id": "t1", "session_id": "s1", "category": "weather", "messages": [...], "tools": [...],
     "expected": [{"get_weather": {"city": ["Paris"], "unit": ["celsius", ""]}}]}

`expected` is BFCL's answer form (each parameter lists its allowed values, "" = may be left
out; a value that is not a list is the one allowed value). `"expected": []` means the right
answer is no call; no `expected` means nothing to score (recorded traffic). Keys starting
with "_" (what `serve --record` adds) and `model`/`stream` are not sent. A bad line is
reported with its line number and skipped; the other lines are still replayed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from switchyard.replay.cases import Case, LineError, TraceError, checker_for
from switchyard.replay.tools import docs_from_openai_tools

REPLAY_KEYS = ("id", "session_id", "category", "expected")
NOT_SENT = ("model", "stream", "stream_options")


def _expected(raw: Any, tool_names: set[str]) -> list[dict[str, dict[str, list[Any]]]]:
    if not isinstance(raw, list):
        raise ValueError("`expected` must be a list of calls like {\"fn\": {\"param\": [allowed...]}}")
    out = []
    for i, call in enumerate(raw):
        if not isinstance(call, dict) or len(call) != 1:
            raise ValueError(f"expected[{i}] must be an object with exactly one function name")
        (name, params), = call.items()
        if not isinstance(params, dict):
            raise ValueError(f"expected[{i}].{name}: parameters must be an object")
        if tool_names and name not in tool_names:
            raise ValueError(f"expected[{i}]: function {name!r} is not among the request's tools")
        out.append({name: {p: (v if isinstance(v, list) else [v]) for p, v in params.items()}})
    return out


def parse_line(obj: Any, default_id: str) -> Case:
    if not isinstance(obj, dict):
        raise ValueError("a line must be a JSON object (an OpenAI chat request)")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("`messages` must be a non-empty list")
    case_id = obj.get("id", default_id)
    if not isinstance(case_id, str | int) or isinstance(case_id, bool):
        raise ValueError("`id` must be a string")
    tools = obj.get("tools") if isinstance(obj.get("tools"), list) else []
    docs = docs_from_openai_tools(tools)
    category = obj.get("category") if isinstance(obj.get("category"), str) else "trace"
    session = obj.get("session_id")
    if session is not None and not isinstance(session, str):
        raise ValueError("`session_id` must be a string")
    if "expected" not in obj or obj["expected"] is None:
        kind, expected = "none", None
    else:
        expected = _expected(obj["expected"], set(docs))
        kind = "ast" if expected else "irrelevance"
    body = {k: v for k, v in obj.items() if k not in REPLAY_KEYS and k not in NOT_SENT and not k.startswith("_")}
    return Case(
        id=str(case_id),
        category=category,
        body=body,
        kind=kind,
        expected=expected,
        functions=docs,
        name_map={},
        session_id=session,
        checker=checker_for(category, len(expected or [])),
    )


def load_jsonl(path: str | Path) -> tuple[list[Case], list[LineError]]:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{p}: no such file") from None
    except OSError as e:
        raise TraceError(f"{p}: cannot read: {e}") from None
    cases: list[Case] = []
    errors: list[LineError] = []
    seen: set[str] = set()
    for n, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            errors.append(LineError(str(p), n, f"not valid JSON: {e}"))
            continue
        try:
            case = parse_line(obj, f"{p.stem}-{n}")
        except ValueError as e:
            errors.append(LineError(str(p), n, str(e)))
            continue
        if case.id in seen:
            errors.append(LineError(str(p), n, f"id {case.id!r} used twice; this line is skipped"))
            continue
        seen.add(case.id)
        cases.append(case)
    return cases, errors
