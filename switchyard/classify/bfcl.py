"""BFCL cases as OpenAI chat bodies with a complexity label: the shipped model's training data.

Deliberately minimal and private to training (the full BFCL -> OpenAI converter with answers
lives in switchyard/replay). One request per case: the first user turn with the tools the case
offers, which is what the gateway sees when the case starts.

Label mapping (by BFCL category; see classifiers/tool-complexity.md):
- complex: the answer needs several calls, a choice among several functions, or several turns:
  parallel, multiple, parallel_multiple, live_multiple, live_parallel, live_parallel_multiple,
  multi_turn_base, multi_turn_long_context, multi_turn_miss_func, multi_turn_miss_param.
- simple: one call of the one offered function, or no call at all: simple_python, simple_java,
  simple_javascript, live_simple, and the relevance checks irrelevance, live_irrelevance (the right
  answer is to call nothing) and live_relevance (any one call is right).
- left out: memory, web_search, format_sensitivity (they need BFCL's agentic harness and state,
  not one chat request).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

COMPLEX = (
    "parallel",
    "multiple",
    "parallel_multiple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "multi_turn_base",
    "multi_turn_long_context",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
)
SIMPLE = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "live_simple",
    "irrelevance",
    "live_irrelevance",
    "live_relevance",
)
CATEGORIES = SIMPLE + COMPLEX

# Multi-turn cases name API classes; their function docs live in one file per class.
_CLASS_DOCS = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
    "WebSearchAPI": "web_search",
    "MemoryAPI_kv": "memory_kv",
    "MemoryAPI_vector": "memory_vector",
    "MemoryAPI_rec_sum": "memory_rec_sum",
}
_DATA = "bfcl_eval/data/"


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    category: str
    label: str
    body: dict[str, Any]


def _json_type(t: Any) -> Any:
    # BFCL uses Python-ish type names; OpenAI wants JSON Schema.
    mapping = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}
    return mapping.get(t, t) if isinstance(t, str) else t


def _schema(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _schema(v) for k, v in node.items()}
        if "type" in out:
            out["type"] = _json_type(out["type"])
        return out
    if isinstance(node, list):
        return [_schema(v) for v in node]
    return node


def to_tool(doc: dict[str, Any]) -> dict[str, Any]:
    name = str(doc.get("name", "")).replace(".", "_")
    params = _schema(doc.get("parameters") or {"type": "object", "properties": {}})
    return {
        "type": "function",
        "function": {"name": name, "description": doc.get("description", ""), "parameters": params},
    }


def _lines(zf: zipfile.ZipFile, member: str) -> Iterator[dict[str, Any]]:
    for line in zf.read(member).decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def _class_tools(zf: zipfile.ZipFile) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for cls, stem in _CLASS_DOCS.items():
        member = f"{_DATA}multi_turn_func_doc/{stem}.json"
        if member in zf.namelist():
            out[cls] = list(_lines(zf, member))
    return out


def _messages(turn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": m.get("role", "user"), "content": m.get("content", "")} for m in turn]


def load_cases(zf: zipfile.ZipFile, categories: tuple[str, ...] = CATEGORIES) -> list[Case]:
    """Every case of the given categories, in file order."""
    class_tools = _class_tools(zf)
    cases: list[Case] = []
    for cat in categories:
        label = "complex" if cat in COMPLEX else "simple"
        for d in _lines(zf, f"{_DATA}BFCL_v4_{cat}.json"):
            question = d.get("question") or [[]]
            first = next((t for t in question if t), [])
            if "function" in d:
                docs = d["function"]
            else:
                hidden = set(d.get("excluded_function") or [])
                for names in (d.get("missed_function") or {}).values():
                    hidden.update(names)
                docs = [
                    doc
                    for cls in d.get("involved_classes", [])
                    for doc in class_tools.get(cls, [])
                    if doc.get("name") not in hidden
                ]
            body: dict[str, Any] = {"model": "auto", "messages": _messages(first)}
            if docs:
                body["tools"] = [to_tool(doc) for doc in docs]
            cases.append(Case(d["id"], cat, label, body))
    return cases
