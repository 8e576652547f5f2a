"""Fixed case lists shipped with the package: `tooluse-92` and `bfcl-sample`.

tooluse-92 is 92 BFCL cases: 46 standard (one function offered, one call wanted) and 46
hard (several functions to choose from, several calls at once, real user queries with
large toolsets, and questions no offered function answers). The rule that picked them,
re-run by the tests against the shipped list:

  for each category in QUOTA, order its ids by sha256("tooluse-92/" + id) (hex, ascending),
  drop BFCL's unanswerable cases (bfcl.UNANSWERABLE), and take the first `count`.

bfcl-sample (BFCL_SAMPLE below: 840 cases of all thirteen single-turn categories, none of
tooluse-92's) is what the small model's outcomes are collected on, with tooluse-92, to train and
judge the outcome router.

The ids are stored in switchyard/suites/NAME.json, so a list does not move when the rule's code
is edited (classifier training reads tooluse-92.json to keep those cases out of its training
data); the data comes from the pinned bfcl-eval wheel.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from switchyard.datasets import SUITES
from switchyard.replay.bfcl import UNANSWERABLE, BfclData, default_data, load_category
from switchyard.replay.cases import Case, TraceError

__all__ = ["RULES", "SUITES", "build", "build_tooluse92", "dump_suite", "load_suite"]

@dataclass(frozen=True)
class SuiteRule:
    """How a shipped case list is picked: per category, ids ordered by sha256(name + "/" + id) hex
    ascending, BFCL's unanswerable cases (and the ids of `exclude`) dropped, first `count` taken."""

    name: str
    quota: list[tuple[str, int, str]]  # (category, count, tier)
    exclude: tuple[str, ...] = ()  # suites whose cases are not picked again

    @property
    def rule(self) -> str:
        dropped = "BFCL's unanswerable cases" + "".join(f" and the cases of {e}" for e in self.exclude)
        return f'per category, ids ordered by sha256("{self.name}/" + id) hex ascending, {dropped} dropped, ' \
               "first `count` taken"


TOOLUSE_92 = SuiteRule("tooluse-92", [
    ("simple_python", 26, "standard"),
    ("live_simple", 20, "standard"),
    ("multiple", 8, "hard"),
    ("parallel", 8, "hard"),
    ("parallel_multiple", 8, "hard"),
    ("live_multiple", 8, "hard"),
    ("live_parallel", 6, "hard"),
    ("irrelevance", 8, "hard"),
])
# A broad sample of every single-turn BFCL category (all of the small live ones), beside
# tooluse-92: what the small model's outcomes are collected on, to train and judge the outcome
# router (its held-out cases are tooluse-92's groups and one group in five of these).
BFCL_SAMPLE = SuiteRule("bfcl-sample", [
    ("simple_python", 100, "standard"),
    ("simple_java", 40, "standard"),
    ("simple_javascript", 30, "standard"),
    ("live_simple", 100, "standard"),
    ("multiple", 80, "hard"),
    ("parallel", 80, "hard"),
    ("parallel_multiple", 80, "hard"),
    ("live_multiple", 140, "hard"),
    ("live_parallel", 16, "hard"),
    ("live_parallel_multiple", 24, "hard"),
    ("irrelevance", 60, "hard"),
    ("live_irrelevance", 80, "hard"),
    ("live_relevance", 16, "hard"),
], exclude=("tooluse-92",))
RULES = {r.name: r for r in (TOOLUSE_92, BFCL_SAMPLE)}
QUOTA, RULE = TOOLUSE_92.quota, TOOLUSE_92.rule


def build(rule: SuiteRule, data: BfclData | None = None) -> dict[str, Any]:
    """The case list as the rule picks it from the data (what its shipped .json holds)."""
    data = data or default_data()
    excluded = set(UNANSWERABLE)
    for name in rule.exclude:
        excluded.update(c["id"] for c in json.loads(SUITES[name].read_text(encoding="utf-8"))["cases"])

    def key(case_id: str) -> str:
        return hashlib.sha256(f"{rule.name}/{case_id}".encode()).hexdigest()

    cases = []
    for category, count, tier in rule.quota:
        entries, _ = data.entries(category)
        ids = sorted((e["id"] for e in entries if e["id"] not in excluded), key=key)[:count]
        cases.extend({"id": i, "category": category, "tier": tier} for i in ids)
    return {
        "name": rule.name,
        "source": "bfcl-eval 2026.3.23 (BFCL v4)",
        "rule": rule.rule,
        "quota": {c: n for c, n, _ in rule.quota},
        "cases": cases,
    }


def build_tooluse92(data: BfclData | None = None) -> dict[str, Any]:
    return build(TOOLUSE_92, data)


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


if __name__ == "__main__":  # regenerate the shipped lists: python -m switchyard.replay.suite
    for r in RULES.values():
        SUITES[r.name].write_text(dump_suite(build(r)), encoding="utf-8")
