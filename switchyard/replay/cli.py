"""`switchyard replay`: tool-use traces through policies, scored, with the split they produce."""

from __future__ import annotations

import asyncio
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from switchyard.policy.loader import PolicyError
from switchyard.replay.cases import Case, LineError, TraceError
from switchyard.replay.compare import RANDOM, Comparison
from switchyard.replay.cost import outcome_tokens, price_run
from switchyard.replay.results import CaseResult, RunResult
from switchyard.replay.summary import summarize

SOURCE_HELP = "tooluse-92 | bfcl:CATEGORY[:N] | FILE.jsonl (several allowed)"


class ReplayUsageError(Exception):
    pass


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    )


def _policy_model(policy: Path) -> tuple[str, Any]:
    from switchyard.policy.loader import load_policy

    spec = load_policy(policy)
    return spec.name or policy.stem, spec


async def _live_runs(
    cases: list[Case], policies: list[Path], gateway: str | None, pool: str | None, model: str | None,
    outcomes: Path | None, concurrency: int, timeout: float, retries: int, extra: dict[str, Any],
    large_pool: str | None, console: Console,
) -> list[RunResult]:
    from switchyard.replay.gateway import GatewayProcess
    from switchyard.replay.live import LiveClient
    from switchyard.replay.outcomes import append_outcomes
    from switchyard.replay.router import pick_large_pool
    from switchyard.replay.runner import run_live

    runs: list[RunResult] = []
    targets: list[Path | None] = list(policies) or [None]
    for policy in targets:
        name, spec = _policy_model(policy) if policy else ("auto", None)
        if pool and spec is not None and pool not in spec.pools:
            raise ReplayUsageError(f"--pool {pool}: not a pool of {policy} (pools: {', '.join(spec.pools)})")
        use_model = model or pool or name
        large = pick_large_pool(spec, large_pool) if spec else (large_pool or "large")
        label = f"{name} (pool {pool})" if pool else name
        starter = GatewayProcess(policy) if gateway is None and policy is not None else nullcontext()
        with starter as proc, _progress(console) as prog:
            url = proc.url if isinstance(proc, GatewayProcess) else gateway
            assert url is not None
            task = prog.add_task(f"replay {label}", total=len(cases))

            def done(_: CaseResult, task: Any = task) -> None:
                prog.advance(task)

            client = LiveClient(url, concurrency, timeout, retries, extra)
            run = await run_live(cases, client, use_model, pool or name, pool, done,
                                 str(policy) if policy else None, large)
        if spec is not None:
            price_run(run, spec)
        if outcomes:
            n = append_outcomes(outcomes, cases, run.results, use_model)
            run.notes.append(f"{n} outcomes appended to {outcomes}")
        runs.append(run)
        if run.aborted:
            break  # the next policy would meet the same dead gateway
    return runs


async def _dry_runs(cases: list[Case], policies: list[Path], large_pool: str | None, console: Console) -> list[RunResult]:
    from switchyard.replay.router import Router
    from switchyard.replay.runner import run_dry

    runs = []
    for policy in policies:
        router = Router(policy, large_pool)
        try:
            with _progress(console) as prog:
                task = prog.add_task(f"route {router.name}", total=len(cases))
                runs.append(await run_dry(cases, router, lambda _r, t=task: prog.advance(t)))
        finally:
            await router.aclose()
    return runs


async def _counterfactual_runs(
    files: list[Path], policies: list[Path], do_sweep: bool, large_pool: str | None, held_out: bool, console: Console
) -> tuple[list[RunResult], list[LineError], Comparison | None]:
    from switchyard.replay.compare import compare
    from switchyard.replay.outcomes import load_outcomes
    from switchyard.replay.router import Router
    from switchyard.replay.runner import hardness, run_counterfactual

    table = load_outcomes(list(files))
    notes = []
    if held_out:
        keep, what = _held_out_filter(policies, [(c.id, c.request) for c in table.cases])
        table.cases = [c for c in table.cases if keep(c.id)]
        notes.append(what)
        if not table.cases:
            raise ReplayUsageError(f"--held-out: no case is left ({what})")
    runs = []
    by_id = {c.id: c for c in table.cases}
    curves: list[tuple[str, dict[str, float], tuple[float, float] | None]] = []
    large = None
    for policy in policies:
        router = Router(policy, large_pool)
        large = large or router.large
        try:
            with _progress(console) as prog:
                task = prog.add_task(f"score {router.name} from outcomes", total=len(table.cases))
                run = await run_counterfactual(table, router, lambda _r, t=task: prog.advance(t))
            price_run(run, router.spec, lambda cid, large=router.large: outcome_tokens(
                by_id[cid].by_pool.get(large) if cid in by_id else None))
            run.notes.extend(notes)
            if do_sweep:
                s = summarize(run)
                own = (s["large_share"], s["score"]) if s["score"] is not None else None
                curves.append((router.name, await hardness(table, router, run), own))
            runs.append(run)
        finally:
            await router.aclose()
    comparison = None
    if do_sweep and large is not None:
        try:
            comparison = compare(table, large, curves, notes)
        except ValueError as e:
            raise ReplayUsageError(f"--sweep: {e}") from None
        for run in runs:
            run.sweep = comparison.curves.get(run.name, []) + comparison.curves.get(RANDOM, [])
    return runs, table.errors, comparison


def _held_out_filter(policies: list[Path], cases: list[tuple[str, dict[str, Any]]]) -> tuple[Any, str]:
    from switchyard.replay.heldout import HeldOutError, held_out_filter

    try:
        return held_out_filter(policies, cases)
    except HeldOutError as e:
        raise ReplayUsageError(str(e)) from None


def replay(
    sources: Annotated[list[str] | None, typer.Argument(help=SOURCE_HELP, show_default=False)] = None,
    policy: Annotated[list[Path] | None, typer.Option("--policy", "-p", help="Policy file; repeat to compare side by side")] = None,
    gateway: Annotated[str | None, typer.Option(help="Running gateway URL (default: start one from the policy)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Classifier and rules only: the split, no model calls")] = False,
    pool: Annotated[str | None, typer.Option(help="Send every case to this pool (model = the pool name)")] = None,
    outcomes: Annotated[Path | None, typer.Option(help="Append per case and pool outcomes (JSONL) to FILE")] = None,
    from_outcomes: Annotated[list[Path] | None, typer.Option("--from-outcomes", help="Score the policies from saved outcomes, no model calls")] = None,
    sweep: Annotated[bool, typer.Option("--sweep", help="With --from-outcomes: each policy's quality vs large share curve and RouteLLM's metrics (APGR, CPT), against a random router")] = False,
    held_out: Annotated[bool, typer.Option("--held-out", help="Only cases no policy's trained classifier learned from (its recorded split)")] = False,
    cluster: Annotated[Path | None, typer.Option(help="Cluster file: report the throughput the split gives vs all-large")] = None,
    plan_policy: Annotated[Path | None, typer.Option(help="With --cluster: planning policy (replicas, rates) if the replayed one has none")] = None,
    out: Annotated[Path | None, typer.Option(help="Write report.json, report.html and PNG plots to DIR")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight at once")] = 4,
    timeout: Annotated[float, typer.Option(help="Seconds per request")] = 120.0,
    retries: Annotated[int, typer.Option(min=0, help="Retries per request (connection errors, 429, 502-504)")] = 2,
    model: Annotated[str | None, typer.Option(help="`model` sent (default: the policy's name, or auto)")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="max_tokens sent with each request")] = None,
    tool_choice: Annotated[str | None, typer.Option(
        "--tool-choice", help="Send this tool_choice (auto | required | none) with every case that has tools, "
                              "instead of the trace's")] = None,
    large_pool: Annotated[str | None, typer.Option(help="Pool counted as 'large' (default: large, else the last pool)")] = None,
    bfcl_data: Annotated[Path | None, typer.Option(help="bfcl-eval wheel or its data/ folder (default: the pinned wheel)")] = None,
    max_steps: Annotated[int, typer.Option(min=1, help="Sessions (bfcl:multi_turn_*): model calls a turn may take before the session is cut short (BFCL: 20)")] = 20,
) -> None:
    """Replay tool-use traces through policies: score, routing split, latency, tokens."""
    console = Console()
    err = Console(stderr=True, soft_wrap=True, highlight=False)
    policies = list(policy or [])
    from switchyard.replay.multiturn.cli import is_session_source
    from switchyard.replay.multiturn.outcomes import is_turn_outcomes

    from_turns = bool(from_outcomes) and all(is_turn_outcomes(f) for f in from_outcomes or [])
    if from_turns or (sources and any(is_session_source(s) for s in sources)):  # agent sessions: replay/multiturn/
        if dry_run:
            err.print("[red]error:[/red] unsupported category for --dry-run: multi-turn sessions need model calls "
                      "(leave out --dry-run and give --gateway or --policy)")
            raise typer.Exit(2)
        _sessions(sources or [], policies, gateway, pool, model, concurrency, timeout, retries, max_tokens, max_steps,
                  large_pool, bfcl_data, out, console, err, outcomes, list(from_outcomes or []) if from_turns else [],
                  held_out)
        return
    try:
        runs, line_errors, comparison = _replay(
            list(sources or []), policies, gateway, dry_run, pool, outcomes, list(from_outcomes or []), sweep,
            concurrency, timeout, retries, model, max_tokens, large_pool, bfcl_data, console, err, held_out,
            tool_choice,
        )
    except (TraceError, ReplayUsageError) as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    except PolicyError as e:
        err.print(f"[red]policy error:[/red]\n{e}")
        raise typer.Exit(2) from None
    except RuntimeError as e:  # a gateway that would not start
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from None
    if cluster:
        from switchyard.replay.capacity import cluster_throughput
        from switchyard.replay.summary import summarize

        for run in runs:
            run.throughput = cluster_throughput(
                cluster, plan_policy or run.policy_file, summarize(run)["large_share"], run.large_pool
            )
    from switchyard.replay.report import render_table, write_report

    render_table(runs, console, comparison)
    if out:
        paths = write_report(out, runs, line_errors, comparison)
        console.print(f"report: {paths['json']}  {paths['html']}")
    if any(r.aborted for r in runs):
        err.print("[red]error:[/red] " + "; ".join(r.aborted for r in runs if r.aborted))
        raise typer.Exit(1)


def _sessions(sources: list[str], policies: list[Path], gateway: str | None, pool: str | None, model: str | None,
              concurrency: int, timeout: float, retries: int, max_tokens: int | None, max_steps: int,
              large_pool: str | None, bfcl_data: Path | None, out: Path | None, console: Console, err: Console,
              outcomes: Path | None = None, from_outcomes: list[Path] | None = None, held_out: bool = False) -> None:
    from switchyard.replay.multiturn.cli import collect_turn_outcomes, replay_sessions, sessions_report

    if not from_outcomes and gateway is None and not policies:
        err.print("[red]error:[/red] give --gateway URL, or --policy FILE to start a gateway for the sessions")
        raise typer.Exit(2)
    try:
        if from_outcomes:
            sessions_report(from_outcomes, policies, large_pool, bfcl_data, out, console, held_out=held_out)
        elif outcomes:
            collect_turn_outcomes(sources, policies, gateway, pool, model, concurrency, timeout, retries,
                                  max_tokens, max_steps, bfcl_data, outcomes, console)
        else:
            replay_sessions(sources, policies, gateway, pool, model, concurrency, timeout, retries, max_tokens,
                            max_steps, large_pool, bfcl_data, out, console)
    except (TraceError, ReplayUsageError) as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    except PolicyError as e:
        err.print(f"[red]policy error:[/red]\n{e}")
        raise typer.Exit(2) from None
    except RuntimeError as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from None


def _replay(
    sources: list[str], policies: list[Path], gateway: str | None, dry_run: bool, pool: str | None,
    outcomes: Path | None, from_outcomes: list[Path], do_sweep: bool, concurrency: int, timeout: float,
    retries: int, model: str | None, max_tokens: int | None, large_pool: str | None, bfcl_data: Path | None,
    console: Console, err: Console, held_out: bool = False, tool_choice: str | None = None,
) -> tuple[list[RunResult], list[LineError], Comparison | None]:
    if held_out and not policies:
        raise ReplayUsageError("--held-out needs --policy FILE (its classifier's training split says what is held out)")
    if from_outcomes:
        if not policies:
            raise ReplayUsageError("--from-outcomes needs at least one --policy to score")
        if sources:
            err.print("[yellow]note:[/yellow] with --from-outcomes the cases come from the outcomes files; SOURCE ignored")
        runs, line_errors, comparison = asyncio.run(
            _counterfactual_runs(from_outcomes, policies, do_sweep, large_pool, held_out, console))
        for e in line_errors:
            err.print(f"[yellow]skipped[/yellow] {e}")
        return runs, line_errors, comparison
    if do_sweep:
        raise ReplayUsageError(
            "--sweep needs --from-outcomes (saved outcomes of both pools: run --pool small --outcomes F "
            "and --pool large --outcomes F first)"
        )
    if not sources:
        raise ReplayUsageError(f"give a SOURCE to replay ({SOURCE_HELP}) or --from-outcomes FILE")
    from switchyard.replay.sources import load_sources

    cases, line_errors = load_sources(sources, bfcl_data)
    for e in line_errors:
        err.print(f"[yellow]skipped[/yellow] {e}")
    if not cases:
        raise TraceError("no cases to replay")
    if held_out:
        keep, what = _held_out_filter(policies, [(c.id, c.body) for c in cases])
        cases = [c for c in cases if keep(c.id)]
        err.print(f"[yellow]note:[/yellow] --held-out: {what}")
        if not cases:
            raise TraceError("--held-out: no case is left")
    if dry_run:
        if pool or outcomes:
            raise ReplayUsageError("--pool and --outcomes need model calls; leave out --dry-run")
        if not policies:
            raise ReplayUsageError("--dry-run needs --policy FILE (the classifier and rules to route with)")
        return asyncio.run(_dry_runs(cases, policies, large_pool, console)), line_errors, None
    if gateway is None and not policies:
        raise ReplayUsageError("give --gateway URL, or --policy FILE to start a gateway for the replay")
    extra: dict[str, Any] = {"temperature": 0}
    if max_tokens:
        extra["max_tokens"] = max_tokens
    if tool_choice is not None:
        if tool_choice not in ("auto", "required", "none"):
            raise ReplayUsageError(f"--tool-choice must be auto, required or none, got {tool_choice!r}")
        extra["tool_choice"] = tool_choice
    runs = asyncio.run(
        _live_runs(cases, policies, gateway, pool, model, outcomes, concurrency, timeout, retries, extra,
                   large_pool, console)
    )
    return runs, line_errors, None


def reference_pool(
    sources: Annotated[list[str], typer.Argument(help=SOURCE_HELP, show_default=False)],
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8301,
    bfcl_data: Annotated[Path | None, typer.Option(help="bfcl-eval wheel or its data/ folder (default: the pinned wheel)")] = None,
) -> None:
    """Answer every case of SOURCES with its reference calls, as model "reference (upper bound)"."""
    from switchyard.replay.reference import MODEL, serve
    from switchyard.replay.sources import load_sources

    err = Console(stderr=True, soft_wrap=True, highlight=False)
    from switchyard.replay.multiturn.cli import is_session_source, serve_reference

    if any(is_session_source(s) for s in sources):  # sessions: turn k of case c answered with its ground truth
        try:
            serve_reference(list(sources), host, port, bfcl_data, err)
        except TraceError as e:
            err.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from None
        return
    try:
        cases, line_errors = load_sources(list(sources), bfcl_data)
    except TraceError as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    for e in line_errors:
        err.print(f"[yellow]skipped[/yellow] {e}")
    unscored = sum(c.kind == "none" for c in cases)
    if unscored == len(cases):
        err.print("[red]error:[/red] no case has a reference answer (recorded traffic without `expected`)")
        raise typer.Exit(2)
    err.print(f"{MODEL}: {len(cases) - unscored} cases on http://{host}:{port}/v1"
              + (f" ({unscored} without a reference answer left out)" if unscored else ""))
    serve([c for c in cases if c.kind != "none"], host, port)

