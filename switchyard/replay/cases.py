"""A replay case: one OpenAI chat request plus what a correct answer looks like.

Every trace source (BFCL, JSONL, recorded traffic) produces `Case`s; the runner sends
`Case.body`, the scorer compares the tool calls that come back with `Case.expected`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

# How a case is judged:
#   "ast"          expected calls in BFCL's answer form; scored by scoring.check_calls
#   "irrelevance"  correct iff the model makes no call
#   "relevance"    correct iff the model makes at least one call (BFCL live_relevance)
#   "none"         nothing to score against (recorded traffic): routing, latency, tokens only
SCORING_KINDS = ("ast", "irrelevance", "relevance", "none")


class TraceError(ValueError):
    """A trace source that cannot be read at all (missing file, unknown category...)."""


@dataclass(frozen=True, slots=True)
class LineError:
    """One bad line of a JSONL trace: reported, skipped, the rest still replayed."""

    source: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.reason}"


@dataclass(slots=True)
class Case:
    id: str
    category: str
    body: dict[str, Any]  # the OpenAI chat request, without `model` (the runner sets it)
    kind: str = "ast"
    expected: list[dict[str, dict[str, list[Any]]]] | None = None  # BFCL ground truth
    # Function descriptions the scorer reads types and required params from, keyed by the
    # name the expected answers use.
    functions: dict[str, dict[str, Any]] = field(default_factory=dict)
    # legal tool name -> the name the expected answers use (BFCL's dotted names)
    name_map: dict[str, str] = field(default_factory=dict)
    session_id: str | None = None
    # "parallel": calls matched in any order; "multiple": exactly one call among many
    # functions; "simple": exactly one call. Derived from the category, as BFCL does.
    checker: str = "simple"
    tier: str | None = None  # suites: "standard" | "hard"
    language: str = "python"  # python | java | javascript (arguments as literals: langs.py)

    def request(self, model: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        body = copy.deepcopy(self.body)
        body["model"] = model
        if extra:
            body.update(extra)
        return body


def checker_for(category: str, n_expected: int) -> str:
    """BFCL picks its checker from the category name; JSONL traces may leave it out."""
    if "parallel" in category:
        return "parallel"
    if "multiple" in category:
        return "multiple"
    if category.startswith("simple") or category in ("live_simple",):
        return "simple"
    return "parallel" if n_expected > 1 else "multiple"
