"""Per-case outcomes of the pools -> training examples for "the small model will fail".

The outcomes file (written by `switchyard replay`) is JSON Lines, one line per (case, pool):

    {"id": "simple_python_3", "pool": "small", "correct": false, "latency_ms": 412.0,
     "prompt_tokens": 310, "completion_tokens": 22,
     "request": {"model": "...", "messages": [...], "tools": [...]}}

`id`, `pool`, `correct` and `request` (the OpenAI chat body as sent) are required; `category`
(optional) groups the per-category report; other keys (switchyard replay also writes tier, kind,
status, error, rule, label, confidence) are ignored. The file is appended to by several runs: when
a (case, pool) pair appears twice, the later line wins. A case is labelled `complex` when the small pool got it wrong (optionally: only
when the large pool got it right, since sending a case both fail to the large pool buys nothing),
`simple` when the small pool got it right. Cases without a small-pool line are skipped.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUIRED = ("id", "pool", "correct", "request")


class OutcomesError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Outcome:
    id: str
    pool: str
    correct: bool
    request: dict[str, Any]
    latency_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    category: str = ""


def read_bytes(path: Path) -> bytes:
    """A JSON Lines file's bytes; a `.gz` name is read through gzip (shipped outcome files are)."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def read_outcomes(path: Path) -> list[Outcome]:
    out: list[Outcome] = []
    try:
        lines = read_bytes(path).decode("utf-8").splitlines()
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise OutcomesError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise OutcomesError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(d, dict):
            raise OutcomesError(f"{path}:{n}: expected an object per line")
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise OutcomesError(f"{path}:{n}: missing {', '.join(missing)} (required: {', '.join(REQUIRED)})")
        if not isinstance(d["correct"], bool):
            raise OutcomesError(f"{path}:{n}: `correct` must be true or false, got {d['correct']!r}")
        if not isinstance(d["request"], dict) or not isinstance(d["request"].get("messages"), list):
            raise OutcomesError(f"{path}:{n}: `request` must be an OpenAI chat body with `messages`")
        out.append(
            Outcome(
                str(d["id"]),
                str(d["pool"]),
                d["correct"],
                d["request"],
                d.get("latency_ms"),
                d.get("prompt_tokens"),
                d.get("completion_tokens"),
                str(d.get("category") or ""),
            )
        )
    return out


def label_cases(
    outcomes: list[Outcome], small_pool: str = "small", large_pool: str = "large", require_large_correct: bool = False
) -> list[tuple[str, dict[str, Any], bool, str]]:
    """(id, request, small_fails, category) per case, in first-seen order; later lines win."""
    pools = sorted({o.pool for o in outcomes})
    if small_pool not in pools:
        raise OutcomesError(f"no outcomes for the small pool {small_pool!r}; pools in the file: {pools}")
    large = {o.id: o.correct for o in outcomes if o.pool == large_pool}
    if require_large_correct and not large:
        raise OutcomesError(f"--require-large-correct: no outcomes for the large pool {large_pool!r}; pools: {pools}")
    small: dict[str, Outcome] = {}
    for o in outcomes:
        if o.pool == small_pool:
            small[o.id] = o  # dicts keep first-insertion order; the value is the last line
    cases = []
    for cid, o in small.items():
        fails = not o.correct
        if require_large_correct and fails:
            fails = large.get(cid, False)
        cases.append((cid, o.request, fails, o.category))
    return cases
