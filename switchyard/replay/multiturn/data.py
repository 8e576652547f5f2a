"""BFCL's multi-turn cases, read from the bfcl-eval wheel (never installed).

A case is a list of user turns, the classes of its environment with their initial state, the
function docs the model is offered (BFCL's multi_turn_func_doc files of those classes, minus the
functions `miss_func` holds out until a later turn), and the ground truth: per turn, the calls
(Python call strings) whose execution defines the expected state and results.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from switchyard.replay.bfcl import BfclData, default_data
from switchyard.replay.cases import TraceError
from switchyard.replay.tools import to_openai_tools

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
# BFCL's own constants (bfcl_eval/constants): the class -> doc file map, the per-turn step cap and
# the user message of a turn that only hands over held-out functions.
FUNC_DOCS = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}
MAX_STEPS = 20
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"


@dataclass(slots=True)
class SessionCase:
    id: str
    category: str
    turns: list[list[dict[str, Any]]]  # user (and system) messages of each turn, as BFCL has them
    initial_config: dict[str, Any]
    involved_classes: list[str]
    functions: list[dict[str, Any]]  # BFCL docs offered from turn 0
    held_out: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # turn -> docs added then
    ground_truth: list[list[str]] = field(default_factory=list)

    @property
    def long_context(self) -> bool:
        return "long_context" in self.category

    def turn_messages(self, k: int) -> list[dict[str, Any]]:
        """The messages that open turn k (a held-out-functions turn has none in the data)."""
        if k in self.held_out and not self.turns[k]:
            return [{"role": "user", "content": ADDED_FUNCTIONS_PROMPT}]
        return [dict(m) for m in self.turns[k]]

    def docs_at(self, k: int) -> list[dict[str, Any]]:
        """The function docs offered during turn k."""
        docs = list(self.functions)
        for t in sorted(self.held_out):
            if t <= k:
                docs.extend(self.held_out[t])
        return docs

    def tools_at(self, k: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """OpenAI tools of turn k and legal name -> BFCL name (multi-turn names are legal already)."""
        tools, name_map, _ = to_openai_tools(self.docs_at(k))
        return tools, name_map


def _docs(data: BfclData, cls: str) -> list[dict[str, Any]]:
    text = data._read(f"multi_turn_func_doc/{FUNC_DOCS[cls]}")  # the data root of the wheel or folder
    if text is None:
        raise TraceError(f"{data.source}: no function docs for {cls}")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def to_session_case(entry: dict[str, Any], category: str, ground_truth: list[list[str]] | None,
                    docs: dict[str, list[dict[str, Any]]]) -> SessionCase:
    cid = str(entry.get("id"))
    classes = [str(c) for c in entry.get("involved_classes") or []]
    unknown = [c for c in classes if c not in FUNC_DOCS]
    if unknown:
        raise TraceError(f"{cid}: unsupported environment classes {unknown}")
    if ground_truth is None:
        raise TraceError(f"{cid}: no possible answer for this case")
    functions = [fn for c in classes for fn in docs[c]]
    held: dict[int, list[dict[str, Any]]] = {}
    for turn, names in (entry.get("missed_function") or {}).items():
        # As BFCL does: each held-out name's doc leaves the list and comes back at its turn.
        held[int(turn)] = []
        for name in names:
            for i, fn in enumerate(functions):
                if fn.get("name") == name:
                    held[int(turn)].append(functions.pop(i))
                    break
    turns = entry.get("question") or []
    if len(turns) != len(ground_truth):
        raise TraceError(f"{cid}: {len(turns)} turns but {len(ground_truth)} ground-truth turns")
    return SessionCase(cid, category, turns, entry.get("initial_config") or {}, classes, functions, held,
                       ground_truth)


def load_sessions(category: str, data: BfclData | None = None, limit: int | None = None,
                  ids: set[str] | None = None) -> list[SessionCase]:
    if category not in CATEGORIES:
        raise TraceError(f"unknown multi-turn category {category!r}; known: {', '.join(CATEGORIES)}")
    data = data or default_data()
    entries, answers = data.entries(category)
    docs = {c: _docs(data, c) for c in FUNC_DOCS}
    out = []
    for e in entries:
        if ids is not None and e["id"] not in ids:
            continue
        out.append(to_session_case(e, category, answers.get(e["id"]), docs))
        if limit is not None and len(out) >= limit:
            break
    return out


def load_session_source(source: str, data: BfclData | None = None) -> list[SessionCase]:
    """`bfcl:multi_turn_base[:N]`, `multi_turn_base[:N]`, `multi_turn` (all four suites), or
    `bfcl:multi_turn_base:ids=100,104` (those cases)."""
    spec = source.removeprefix("bfcl:")
    name, _, n = spec.partition(":")
    if n.startswith("ids="):
        wanted = {f"{name}_{i.strip()}" for i in n[4:].split(",") if i.strip()}
        got = load_sessions(name, data, ids=wanted)
        if len(got) != len(wanted):
            raise TraceError(f"{source!r}: not found: {sorted(wanted - {c.id for c in got})}")
        return got
    if n and (not n.isdigit() or int(n) < 1):
        raise TraceError(f"{source!r}: N must be a whole number >= 1")
    limit = int(n) if n else None
    cats = CATEGORIES if name == "multi_turn" else (name,)
    return [c for cat in cats for c in load_sessions(cat, data, limit)]
