"""SOURCE arguments of `switchyard replay` -> cases.

  tooluse-92             the shipped suite
  bfcl:CATEGORY[:N]      a BFCL category (first N cases), e.g. bfcl:simple_python:20
  PATH.jsonl             a JSONL trace (also what `serve --record` writes)
"""

from __future__ import annotations

from pathlib import Path

from switchyard.replay.bfcl import BfclData, default_data, load_category
from switchyard.replay.cases import Case, LineError, TraceError
from switchyard.replay.jsonl import load_jsonl
from switchyard.replay.suite import SUITES, load_suite


def load_source(source: str, bfcl_data: str | Path | None = None) -> tuple[list[Case], list[LineError]]:
    data: BfclData | None = None

    def bfcl() -> BfclData:
        nonlocal data
        if data is None:
            data = BfclData(bfcl_data) if bfcl_data else default_data()
        return data

    if source in SUITES:
        return load_suite(source, bfcl()), []
    if source.startswith("bfcl:"):
        parts = source.split(":")
        if len(parts) not in (2, 3) or not parts[1]:
            raise TraceError(f"{source!r}: expected bfcl:CATEGORY or bfcl:CATEGORY:N")
        limit = None
        if len(parts) == 3:
            if not parts[2].isdigit() or int(parts[2]) < 1:
                raise TraceError(f"{source!r}: N must be a whole number >= 1")
            limit = int(parts[2])
        return load_category(parts[1], bfcl(), limit=limit), []
    p = Path(source)
    if p.suffix in (".jsonl", ".json", ".ndjson") or p.exists():
        return load_jsonl(p)
    raise TraceError(
        f"{source!r}: not a suite ({', '.join(SUITES)}), a bfcl:CATEGORY, or an existing .jsonl file"
    )


def load_sources(sources: list[str], bfcl_data: str | Path | None = None) -> tuple[list[Case], list[LineError]]:
    cases: list[Case] = []
    errors: list[LineError] = []
    seen: set[str] = set()
    for s in sources:
        got, errs = load_source(s, bfcl_data)
        errors.extend(errs)
        for c in got:
            if c.id in seen:
                continue  # the same case named twice (e.g. a suite and its category) runs once
            seen.add(c.id)
            cases.append(c)
    return cases, errors
