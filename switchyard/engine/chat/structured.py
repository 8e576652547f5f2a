"""What a chat request asks the output to be: OpenAI's `tool_choice`, `parallel_tool_calls` and
`response_format`, turned into one grammar (llguidance's Lark dialect) or none.

Tool calls are written as the engine renders them into the prompt (Hermes style, see tools.py):
`<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`, calls separated by a newline.
The grammar fixes everything but the choice of tool and ARGS, and ARGS follows that tool's
`parameters` schema. Plain values go out (Constraint); compiling is grammar.py's job.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from switchyard.engine.errors import RequestError

# Compact JSON with json.dumps' separators (the form the tool prompt shows): a small model
# given free whitespace can pad an object with newlines until its budget runs out.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class SchemaPart:
    """One JSON Schema of the grammar and the request parameter it came from (for a 400)."""

    param: str
    schema: Any


@dataclass(frozen=True)
class Constraint:
    """A request's grammar; `tools`: the reply's tool calls are constrained (finish_reason
    "tool_calls" when it makes some)."""

    grammar: str
    parts: tuple[SchemaPart, ...]
    mode: str  # required | named | auto | json
    tools: bool

    @property
    def key(self) -> str:
        return hashlib.sha256(self.grammar.encode()).hexdigest()


def _lit(text: str) -> str:
    """A Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


def _closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` wherever an object lists its properties
    and says nothing about others (as OpenAI's strict mode and xgrammar's strict_mode do): the
    output still validates against the original, and a small model cannot invent keys. Not
    inside allOf or not, where closing a branch would change what the whole accepts."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) if k in ("items", "prefixItems", "anyOf", "oneOf", "additionalProperties")
           else v for k, v in schema.items()}
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            out[key] = {k: _closed(v) for k, v in schema[key].items()}
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema \
            and "patternProperties" not in schema:
        out["additionalProperties"] = False
    return out


def _json_rule(schema: Any) -> str:
    s = _closed(copy.deepcopy(schema)) if isinstance(schema, dict) else schema
    if isinstance(s, dict):
        s = {**s, "x-guidance": _JSON_STYLE}
    elif s is True:
        s = {"x-guidance": _JSON_STYLE}
    return "%json " + json.dumps(s, ensure_ascii=False)


def _tool_name(tool: dict[str, Any]) -> str:
    return tool.get("function", tool)["name"]


def _tool_params(tool: dict[str, Any]) -> Any:
    params = tool.get("function", tool).get("parameters")
    # No parameters: a function of no arguments, called with {}.
    return params if params is not None else {"type": "object", "properties": {}}


def tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> str | None:
    """"none" | "auto" | "required", or the name of the one function the reply must call;
    a choice that names no declared tool is a 400 on `tool_choice`."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise RequestError("tool_choice 'required' needs a non-empty 'tools'", "tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict) \
            and isinstance(choice["function"].get("name"), str):
        name = choice["function"]["name"]
        if not tools or name not in {_tool_name(t) for t in tools}:
            raise RequestError(f"tool_choice names function {name!r}, which is not among 'tools'", "tool_choice",
                               "invalid_tool_choice")
        return name
    raise RequestError("'tool_choice' must be 'none', 'auto', 'required' or "
                       "{'type': 'function', 'function': {'name': ...}}", "tool_choice")


def _response_schema(body: dict[str, Any]) -> SchemaPart | None:
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise RequestError("'response_format' must be an object", "response_format")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return SchemaPart("response_format", {"type": "object"})
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise RequestError("response_format.json_schema must be an object with 'name' and 'schema'",
                               "response_format.json_schema")
        schema = js.get("schema", {})
        if not isinstance(schema, dict | bool):
            raise RequestError("response_format.json_schema.schema must be a JSON Schema object",
                               "response_format.json_schema.schema")
        return SchemaPart("response_format.json_schema.schema", schema)
    raise RequestError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                       "response_format.type")


def constraint(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> Constraint | None:
    """The grammar a chat request's reply must follow, or None for free text. `tools`: as
    protocol.tools_of returns them (None under tool_choice 'none')."""
    choice = tool_choice(body, tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    response = _response_schema(body)
    if choice == "none" or not tools:
        if response is None:
            return None
        return Constraint(f"start: {_json_rule(response.schema)}\n", (response,), "json", tools=False)
    named = choice not in ("auto", "required")
    fns, parts = [], []
    for i, t in enumerate(tools):
        name = _tool_name(t)
        if named and name != choice:
            continue
        part = SchemaPart(f"tools.{i}.function.parameters", _tool_params(t))
        parts.append(part)
        head = _lit('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
        fns.append(f"{head} {_json_rule(part.schema)} {_lit('}')}")
    lines = [f"fn_{i}: {f}" for i, f in enumerate(fns)]
    lines.append("call: " + _lit("\n") + " (" + " | ".join(f"fn_{i}" for i in range(len(fns))) + ") "
                 + _lit("\n" + CLOSE))
    more = parallel is not False and not named
    lines.append("calls: call" + (f" ({_lit(chr(10) + OPEN)} call)*" if more else ""))
    if choice == "auto":
        if response is not None:  # the reply is either that JSON or calls
            parts.append(response)
            start = f"start: {_json_rule(response.schema)} | {_lit(OPEN)} calls"
        else:
            # Free text until the model writes the opening tag (a lazy lexeme: the text
            # ends at its first occurrence), then the rest of the call is constrained.
            start = "start: TEXT | opening calls\nopening[lazy]: TEXT " + _lit(OPEN) + "\nTEXT: /(.|\\n)*/"
        mode = "auto"
    else:
        start = f"start: {_lit(OPEN)} calls"
        mode = "named" if named else "required"
    grammar = "%llguidance {}\n" + start + "\n" + "\n".join(lines) + "\n"
    return Constraint(grammar, tuple(parts), mode, tools=True)
