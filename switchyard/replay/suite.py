"""Fixed case lists shipped with the package, starting with `tooluse-92`.

tooluse-92 is 92 BFCL cases: 46 standard (one function offered, one call wanted) and 46
hard (several functions to choose from, several calls at once, real user queries with
large toolsets, and questions no offered function answers). The rule that picked them,
re-run by the tests against the shipped list:

  for each category in QUOTA, order its ids by sha256("tooluse-92/" + id) (hex, ascending),
  drop BFCL's unanswerable cases (bfcl.UNANSWERABLE), and take the first `count`.

The ids are stored in switchyard/suites/tooluse-92.json, so the suite does not move when the
rule's code is edited (classifier training reads the same file to keep these cases out of
its training data); the data comes from the pinned bfcl-eval wheel.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from switchyard.datasets import SUITES
from switchyard.replay.bfcl import UNANSWERABLE, BfclData, default_data, load_category
from switchyard.replay.cases import Case, TraceError

__all__ = ["SUITES", "build_tooluse92", "dump_suite", "load_suite"]

# (category, count, tier)
QUOTA: list[tuple[str, int, str]] = [
    ("simple_python", 26, "standard"),
    ("live_simple", 20, "standard"),
    ("multiple", 8, "hard"),
    ("parallel", 8, "hard"),
    ("parallel_multiple", 8, "hard"),
    ("live_multiple", 8, "hard"),
    ("live_parallel", 6, "hard"),
    ("irrelevance", 8, "hard"),
]
RULE = (
    'per category, ids ordered by sha256("tooluse-92/" + id) hex ascending, '
    "BFCL's unanswerable cases dropped, first `count` taken"
)


def _key(case_id: str) -> str:
    return hashlib.sha256(f"tooluse-92/{case_id}".encode()).hexdigest()


def build_tooluse92(data: BfclData | None = None) -> dict[str, Any]:
    """The suite as the rule picks it from the data (what tooluse-92.json holds)."""
    data = data or default_data()
    cases = []
    for category, count, tier in QUOTA:
        entries, _ = data.entries(category)
        ids = sorted((e["id"] for e in entries if e["id"] not in UNANSWERABLE), key=_key)[:count]
        cases.extend({"id": i, "category": category, "tier": tier} for i in ids)
    return {
        "name": "tooluse-92",
        "source": "bfcl-eval 2026.3.23 (BFCL v4)",
        "rule": RULE,
        "quota": {c: n for c, n, _ in QUOTA},
        "cases": cases,
    }


def load_suite(name: str, data: BfclData | None = None) -> list[Case]:
    path = SUITES.get(name)
    if path is None:
        raise TraceError(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    spec = json.loads(path.read_text(encoding="utf-8"))
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for c in spec["cases"]:
        by_cat.setdefault(c["category"], []).append(c)
    loaded: dict[str, Case] = {}
    for cat, items in by_cat.items():
        for case in load_category(cat, data, ids=[c["id"] for c in items]):
            loaded[case.id] = case
    out = []
    for c in spec["cases"]:
        case = loaded[c["id"]]
        case.tier = c.get("tier")
        out.append(case)
    return out


def dump_suite(spec: dict[str, Any]) -> str:
    """JSON with one case per line: readable in a diff."""
    head = {k: v for k, v in spec.items() if k != "cases"}
    lines = ",\n".join("  " + json.dumps(c) for c in spec["cases"])
    return json.dumps(head, indent=1)[:-2] + ',\n "cases": [\n' + lines + "\n ]\n}\n"


if __name__ == "__main__":  # regenerate the shipped list: python -m switchyard.replay.suite
    SUITES["tooluse-92"].write_text(dump_suite(build_tooluse92()), encoding="utf-8")
