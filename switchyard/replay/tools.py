"""BFCL function docs -> OpenAI tools, and tool names made legal for OpenAI.

BFCL writes parameter types in its own vocabulary (`dict`, `float`, `tuple`, `any`...);
OpenAI wants JSON Schema. Names like `math.factorial` are not legal OpenAI tool names
(^[a-zA-Z0-9_-]{1,64}$), so they are rewritten and mapped back before scoring.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any

BFCL_TO_JSON_SCHEMA = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
}
# BFCL appends this to every Python-category function description it sends.
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
_LEGAL = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ILLEGAL_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def legal_name(name: str, taken: set[str]) -> str:
    """A legal OpenAI tool name for `name`, distinct from every name in `taken`."""
    if _LEGAL.match(name) and name not in taken:
        return name
    base = _ILLEGAL_CHARS.sub("_", name) or "f"
    candidate = base[:64]
    if candidate in taken or len(base) > 64:
        # A short digest keeps two long or colliding names apart, deterministically.
        digest = hashlib.blake2b(name.encode(), digest_size=4).hexdigest()
        candidate = f"{base[:55]}_{digest}"
    n = 2
    while candidate in taken:
        candidate = f"{base[:60]}_{n}"
        n += 1
    return candidate


def _schema(prop: dict[str, Any]) -> dict[str, Any]:
    out = dict(prop)
    t = prop.get("type")
    bfcl_type = t if isinstance(t, str) else "string"
    out["type"] = BFCL_TO_JSON_SCHEMA.get(bfcl_type, "string")
    if bfcl_type == "float":  # as BFCL tells OpenAI-style models
        out["format"] = "float"
        out["description"] = str(prop.get("description", "")) + " This is a float type value."
    if isinstance(prop.get("properties"), dict):
        out["properties"] = {k: _schema(v) for k, v in prop["properties"].items() if isinstance(v, dict)}
    if isinstance(prop.get("items"), dict):
        out["items"] = _schema(prop["items"])
    return out


def to_openai_tools(
    functions: list[dict[str, Any]], hint: str = PYTHON_HINT
) -> tuple[list[dict[str, Any]], dict[str, str], dict]:
    """(tools, legal -> original name, original name -> BFCL function doc) for a BFCL function list."""
    tools: list[dict[str, Any]] = []
    name_map: dict[str, str] = {}
    docs: dict[str, dict[str, Any]] = {}
    taken: set[str] = set()
    for fn in functions:
        original = str(fn.get("name", ""))
        name = legal_name(original, taken)
        taken.add(name)
        name_map[name] = original
        docs[original] = fn
        params = copy.deepcopy(fn.get("parameters") or {})
        props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {k: _schema(v) for k, v in props.items() if isinstance(v, dict)},
        }
        if isinstance(params.get("required"), list):
            schema["required"] = list(params["required"])
        tools.append(
            {
                "type": "function",
                "function": {"name": name, "description": str(fn.get("description", "")) + hint,
                             "parameters": schema},
            }
        )
    return tools, name_map, docs


def docs_from_openai_tools(tools: list[Any]) -> dict[str, dict[str, Any]]:
    """Function docs (for the scorer) from an OpenAI `tools` list: JSON Schema types as they are."""
    docs: dict[str, dict[str, Any]] = {}
    for t in tools:
        if not isinstance(t, dict):
            continue
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        name = fn.get("name")
        if isinstance(name, str):
            docs[name] = {"name": name, "parameters": fn.get("parameters") or {}}
    return docs
