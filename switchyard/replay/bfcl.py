"""BFCL test categories as replay cases, read straight from the bfcl-eval wheel.

The data can also come from a wheel file given by path, or an unpacked `data/` folder
(holding BFCL_v4_<category>.json and possible_answer/). Only single-turn categories are
supported (Java and JavaScript ones too: arguments as literals, see langs.py); multi-turn,
memory, web-search and format-sensitivity categories need BFCL's stateful harness and are
refused with a clear "unsupported category" error.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from switchyard.replay.cases import Case, TraceError, checker_for
from switchyard.replay.langs import string_params
from switchyard.replay.tools import to_openai_tools

AST_CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
IRRELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance")
RELEVANCE_CATEGORIES = ("live_relevance",)
LANGUAGE_CATEGORIES = {"simple_java": "java", "simple_javascript": "javascript"}
SUPPORTED = AST_CATEGORIES + tuple(LANGUAGE_CATEGORIES) + IRRELEVANCE_CATEGORIES + RELEVANCE_CATEGORIES
UNSUPPORTED = (
    "multi_turn_base",
    "multi_turn_long_context",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "memory",
    "web_search",
    "format_sensitivity",
)
# Cases whose BFCL answer contradicts the function's own doc (a parameter the function does
# not declare; a required one the answer leaves out): under BFCL's rules no answer passes.
# Kept (BFCL scores them so), left out of the tooluse-92 suite.
UNANSWERABLE = frozenset({"live_multiple_862-181-3", "live_multiple_964-207-0"})
ALIASES = {"simple": "simple_python", "python": "simple_python"}
_PREFIX = "BFCL_v4_"


class BfclData:
    """Reads category files from the wheel zip or a folder; one instance per data source."""

    def __init__(self, source: str | Path | None = None):
        self.source = str(source) if source else "bfcl-eval wheel"
        self._zip: zipfile.ZipFile | None = None
        self._dir: Path | None = None
        if source is None:
            from switchyard.datasets import bfcl_zip

            self._zip = bfcl_zip()
            self._root = "bfcl_eval/data/"
            return
        p = Path(source)
        if not p.exists():
            raise TraceError(f"{p}: no such file or folder (expected the bfcl-eval wheel or its data/ folder)")
        if p.is_file():
            try:
                self._zip = zipfile.ZipFile(p)
            except zipfile.BadZipFile:
                raise TraceError(f"{p}: not a wheel (zip) file") from None
            self._root = "bfcl_eval/data/"
        else:
            for cand in (p, p / "data", p / "bfcl_eval" / "data"):
                if any(cand.glob(f"{_PREFIX}*.json")):
                    self._dir = cand
                    break
            else:
                raise TraceError(f"{p}: no {_PREFIX}<category>.json files in it or in its data/ folder")

    def _read(self, rel: str) -> str | None:
        if self._zip is not None:
            try:
                return self._zip.read(self._root + rel).decode("utf-8")
            except KeyError:
                return None
        assert self._dir is not None
        f = self._dir / rel
        return f.read_text(encoding="utf-8") if f.exists() else None

    def categories(self) -> list[str]:
        if self._zip is not None:
            names = [n[len(self._root):] for n in self._zip.namelist() if n.startswith(self._root)]
        else:
            assert self._dir is not None
            names = [q.name for q in self._dir.iterdir()]
        return sorted(n[len(_PREFIX):-5] for n in names if n.startswith(_PREFIX) and n.endswith(".json"))

    def entries(self, category: str) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
        """(question entries, id -> ground truth) of one category."""
        text = self._read(f"{_PREFIX}{category}.json")
        if text is None:
            raise TraceError(f"unknown BFCL category {category!r} in {self.source}")
        answers: dict[str, list[Any]] = {}
        atext = self._read(f"possible_answer/{_PREFIX}{category}.json")
        if atext is not None:
            for line in atext.splitlines():
                if line.strip():
                    a = json.loads(line)
                    answers[a["id"]] = a["ground_truth"]
        return [json.loads(line) for line in text.splitlines() if line.strip()], answers


def resolve_category(name: str, data: BfclData) -> str:
    cat = ALIASES.get(name, name)
    if cat in UNSUPPORTED:
        raise TraceError(
            f"unsupported category {cat!r}: replay scores single-turn categories only "
            f"({', '.join(SUPPORTED)})"
        )
    if cat not in SUPPORTED:
        known = [c for c in data.categories() if c in SUPPORTED]
        raise TraceError(f"unknown BFCL category {name!r}; supported: {', '.join(known)}")
    return cat


def entry_to_case(entry: dict[str, Any], category: str, ground_truth: list[Any] | None) -> Case:
    turns = entry.get("question") or []
    if len(turns) != 1:
        raise TraceError(f"{entry.get('id')}: {len(turns)} turns; only single-turn cases are supported")
    functions = entry.get("function") or []
    language = LANGUAGE_CATEGORIES.get(category, "python")
    if language == "python":
        tools, name_map, docs = to_openai_tools(functions)
    else:  # the model sees string parameters; the scorer keeps the typed docs
        tools, name_map, _ = to_openai_tools(string_params(functions, language), hint="")
        docs = {str(fn.get("name", "")): fn for fn in functions}
    if ground_truth is not None:
        ground_truth = _fix_empty_lists(ground_truth, docs)
    body: dict[str, Any] = {"messages": [dict(m) for m in turns[0]], "tools": tools}
    if category in IRRELEVANCE_CATEGORIES:
        kind, expected = "irrelevance", []
    elif category in RELEVANCE_CATEGORIES:
        kind, expected = "relevance", None
    else:
        if ground_truth is None:
            raise TraceError(f"{entry.get('id')}: no possible answer for this case")
        kind, expected = "ast", ground_truth
    return Case(
        id=str(entry["id"]),
        category=category,
        body=body,
        kind=kind,
        expected=expected,
        functions=docs,
        name_map=name_map,
        checker=checker_for(category, len(expected or [])),
        language=language,
    )


def _fix_empty_lists(ground_truth: list[Any], docs: dict[str, dict[str, Any]]) -> list[Any]:
    """A few BFCL answers give an array parameter no allowed value at all (`[]`) where the
    intent is the empty list; read as written, no answer could ever pass. Read `[]` there as
    "the empty list"."""
    out = []
    for call in ground_truth:
        fixed = {}
        for name, params in call.items():
            props = (docs.get(name, {}).get("parameters") or {}).get("properties") or {}
            fixed[name] = {
                p: ([[]] if allowed == [] and (props.get(p) or {}).get("type") == "array" else allowed)
                for p, allowed in params.items()
            }
        out.append(fixed)
    return out


def load_category(
    category: str, data: BfclData | None = None, ids: Iterable[str] | None = None, limit: int | None = None
) -> list[Case]:
    data = data or default_data()
    cat = resolve_category(category, data)
    entries, answers = data.entries(cat)
    wanted = set(ids) if ids is not None else None
    out: list[Case] = []
    for e in entries:
        if wanted is not None and e["id"] not in wanted:
            continue
        out.append(entry_to_case(e, cat, answers.get(e["id"])))
        if limit is not None and len(out) >= limit:
            break
    if wanted is not None:
        missing = wanted - {c.id for c in out}
        if missing:
            raise TraceError(f"{cat}: ids not found in {data.source}: {sorted(missing)[:5]}")
    return out


@lru_cache(maxsize=1)
def default_data() -> BfclData:
    return BfclData(None)
