"""`switchyard replay bfcl:multi_turn_*`: sessions run live through a gateway, scored, summarised.

Each session gets its own id (`RUN/CASE_ID`), sessions run a few at a time (each one's turns in
order), every record lands in sessions.jsonl (the steps with their pools, the verdict), and the
summary counts solve rate and the share of turns and requests the large pool served. A turn
counts as large when any of its requests went there (an escalation inside a turn makes it large).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from switchyard.replay.multiturn.checker import score
from switchyard.replay.multiturn.data import SessionCase
from switchyard.replay.multiturn.session import SessionClient, SessionRecord


@dataclass(slots=True)
class SessionRun:
    name: str
    large_pool: str
    records: list[SessionRecord] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        recs = self.records
        turns = [t for r in recs for t in r.turns]
        steps = [s for t in turns for s in t.steps]
        large_turns = sum(any(s.pool == self.large_pool for s in t.steps) for t in turns)
        by_cat: dict[str, list[bool]] = {}
        for r in recs:
            by_cat.setdefault(r.category, []).append(bool(r.verdict and r.verdict["valid"]))
        served = sorted({s.served_by for s in steps if s.served_by and s.pool == self.large_pool})
        return {
            "sessions": len(recs),
            "solved": sum(bool(r.verdict and r.verdict["valid"]) for r in recs),
            "solve_rate": round(100 * sum(bool(r.verdict and r.verdict["valid"]) for r in recs) / len(recs), 1)
            if recs else None,
            "turns": len(turns),
            "turns_passed": sum(t is True for r in recs for t in (r.verdict or {}).get("turns", [])),
            "large_turn_share": round(large_turns / len(turns), 4) if turns else None,
            "requests": len(steps),
            "large_request_share": round(sum(s.pool == self.large_pool for s in steps) / len(steps), 4)
            if steps else None,
            "pools": {p: sum(s.pool == p for s in steps) for p in sorted({str(s.pool) for s in steps})},
            "large_served_by": served,
            "cut_short": sum(r.force_quit for r in recs),
            "errors": sum(bool(r.error) for r in recs),
            "per_category": {c: round(100 * sum(v) / len(v), 1) for c, v in sorted(by_cat.items())},
            "wall_s": round(self.wall_s, 1),
        }


async def run_sessions(cases: list[SessionCase], client: SessionClient, name: str, large_pool: str,
                       concurrency: int = 2, on_done: Callable[[SessionRecord], None] | None = None,
                       run_id: str | None = None) -> SessionRun:
    run = SessionRun(name, large_pool)
    tag = run_id or uuid.uuid4().hex[:8]
    sem = asyncio.Semaphore(max(1, concurrency))
    t0 = time.perf_counter()
    timeout = httpx.Timeout(client.timeout, connect=min(5.0, client.timeout))
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as http:

        async def one(case: SessionCase) -> SessionRecord:
            async with sem:
                rec = await client.run(http, case, f"{tag}/{case.id}")
            # The check re-runs the environments: CPU work, off the loop.
            rec.verdict = (await asyncio.to_thread(score, case, rec)).to_json()
            if on_done:
                on_done(rec)
            return rec

        run.records = list(await asyncio.gather(*(one(c) for c in cases)))
    run.wall_s = time.perf_counter() - t0
    return run


def write_records(path: Path, run: SessionRun) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for r in run.records:
            f.write(json.dumps({"run": run.name, **r.to_json()}, ensure_ascii=False) + "\n")


def load_records(path: Path) -> list[SessionRecord]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            d.pop("run", None)
            out.append(SessionRecord.from_json(d))
    return out
