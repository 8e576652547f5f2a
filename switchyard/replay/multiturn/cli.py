"""The sessions side of `switchyard replay` and `switchyard reference-pool`: a SOURCE that names a
multi-turn suite (`bfcl:multi_turn_base[:N]`, ..., `bfcl:multi_turn[:N]` for all four) runs here."""

from __future__ import annotations

import asyncio
import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from switchyard.replay.cases import TraceError
from switchyard.replay.multiturn.data import CATEGORIES, SessionCase, load_session_source


def is_session_source(source: str) -> bool:
    name = source.removeprefix("bfcl:").partition(":")[0]
    return source.startswith("bfcl:") and (name == "multi_turn" or name in CATEGORIES)


def load_cases(sources: list[str], bfcl_data: Path | None) -> list[SessionCase]:
    from switchyard.replay.bfcl import BfclData

    data = BfclData(bfcl_data) if bfcl_data else None
    seen: dict[str, SessionCase] = {}
    for s in sources:
        if not is_session_source(s):
            raise TraceError(f"{s!r}: sessions and single requests cannot be replayed together")
        for c in load_session_source(s, data):
            seen.setdefault(c.id, c)
    if not seen:
        raise TraceError("no sessions to replay")
    return list(seen.values())


def replay_sessions(
    sources: list[str], policies: list[Path], gateway: str | None, pool: str | None, model: str | None,
    concurrency: int, timeout: float, retries: int, max_tokens: int | None, max_steps: int,
    large_pool: str | None, bfcl_data: Path | None, out: Path | None, console: Console,
) -> list[dict[str, Any]]:
    from switchyard.replay.gateway import GatewayProcess
    from switchyard.replay.multiturn.run import run_sessions, write_records
    from switchyard.replay.multiturn.session import SessionClient

    cases = load_cases(sources, bfcl_data)
    extra: dict[str, Any] = {"temperature": 0}
    if max_tokens:
        extra["max_tokens"] = max_tokens
    summaries = []
    for policy in policies or [None]:
        name = policy.stem if policy else "auto"
        large = large_pool or "large"
        if policy is not None:
            from switchyard.policy.loader import load_policy
            from switchyard.replay.router import pick_large_pool

            spec = load_policy(policy)
            name, large = spec.name or policy.stem, pick_large_pool(spec, large_pool)
        starter = GatewayProcess(policy) if gateway is None and policy is not None else nullcontext()
        with starter as proc:
            url = proc.url if isinstance(proc, GatewayProcess) else gateway
            assert url is not None
            client = SessionClient(url, model or pool or name, timeout, retries, extra, max_steps)
            run = asyncio.run(run_sessions(cases, client, name, large, concurrency))
        s = {"name": name, "large_pool": large, **run.summary()}
        summaries.append(s)
        if out:
            write_records(out / "sessions.jsonl", run)
    table = Table(title=f"{len(cases)} sessions")
    for col in ("policy", "solved", "turns passed", "large turns", "large requests", "pools", "wall s"):
        table.add_column(col)
    for s in summaries:
        served = f" ({', '.join(s['large_served_by'])})" if s["large_served_by"] else ""
        table.add_row(s["name"], f"{s['solved']}/{s['sessions']} ({s['solve_rate']}%)",
                      f"{s['turns_passed']}/{s['turns']}", f"{100 * (s['large_turn_share'] or 0):.1f}%{served}",
                      f"{100 * (s['large_request_share'] or 0):.1f}%",
                      " ".join(f"{p}:{n}" for p, n in s["pools"].items()), str(s["wall_s"]))
    console.print(table)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "sessions_summary.json").write_text(json.dumps(summaries, indent=2), encoding="utf-8")
        console.print(f"records: {out / 'sessions.jsonl'}  summary: {out / 'sessions_summary.json'}")
    return summaries


def serve_reference(sources: list[str], host: str, port: int, bfcl_data: Path | None, err: Console) -> None:
    from switchyard.replay.multiturn.reference import serve
    from switchyard.replay.reference import MODEL

    cases = load_cases(sources, bfcl_data)
    err.print(f"{MODEL}: {len(cases)} sessions on http://{host}:{port}/v1 (session id PREFIX/CASE_ID)")
    serve(cases, host, port)


def collect_turn_outcomes(
    sources: list[str], policies: list[Path], gateway: str | None, pool: str | None, model: str | None,
    concurrency: int, timeout: float, retries: int, max_tokens: int | None, max_steps: int,
    bfcl_data: Path | None, outcomes: Path, console: Console,
) -> None:
    """Every turn of every session on one pool, from the ground truth's history (outcomes.py)."""
    from switchyard.replay.gateway import GatewayProcess
    from switchyard.replay.multiturn.outcomes import collect
    from switchyard.replay.multiturn.session import SessionClient

    if not pool:
        raise TraceError("--outcomes with sessions needs --pool NAME (run it once per pool)")
    cases = load_cases(sources, bfcl_data)
    extra: dict[str, Any] = {"temperature": 0, **({"max_tokens": max_tokens} if max_tokens else {})}
    policy = policies[0] if policies else None
    starter = GatewayProcess(policy) if gateway is None and policy is not None else nullcontext()
    with starter as proc:
        url = proc.url if isinstance(proc, GatewayProcess) else gateway
        assert url is not None
        got = asyncio.run(collect(cases, SessionClient(url, model or pool, timeout, retries, extra, max_steps),
                                  pool, concurrency, outcomes))
    passed = sum(o.passed for o in got)
    console.print(f"pool {pool}: {passed}/{len(got)} turns of {len(cases)} sessions pass from the ground truth's "
                  f"history; {len(got)} outcomes appended to {outcomes}")


def sessions_report(files: list[Path], policies: list[Path], large_pool: str | None, bfcl_data: Path | None,
                    out: Path | None, console: Console, small_pool: str = "small", held_out: bool = False) -> dict[str, Any]:
    from switchyard.replay.bfcl import BfclData
    from switchyard.replay.multiturn.outcomes import load_turn_outcomes
    from switchyard.replay.multiturn.report import build, markdown, write

    try:
        rep = asyncio.run(build(load_turn_outcomes(files), policies, small_pool, large_pool or "large", large_pool,
                                BfclData(bfcl_data) if bfcl_data else None, held_out))
    except ValueError as e:
        raise TraceError(str(e)) from None
    console.print(markdown(rep))
    if out:
        paths = write(out, rep)
        console.print(f"report: {paths['html']}  {paths['md']}  {paths['json']}")
    return rep
