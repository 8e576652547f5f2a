"""`switchyard plan`: placement, checks, projected throughput, simulation, plot and launch files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SATURATION = 1.25  # offered load / closed-form capacity when measuring the simulated saturation


def _fail(msg: str) -> typer.Exit:
    typer.echo(msg, err=True)
    return typer.Exit(1)


def plan(
    policy: Annotated[Path, typer.Option("--policy", "-p", help="Planning policy (pools with replicas, nodes_per_replica, rate, ...)")],
    cluster: Annotated[Path | None, typer.Option("--cluster", "-c", help="Cluster file (nodes, fabric); default: this machine, one node")] = None,
    emit: Annotated[Path | None, typer.Option("--emit", "-o", help="Write torchrun scripts, compose and Kubernetes files into DIR")] = None,
    large: Annotated[str | None, typer.Option("--large", help="The large pool for the capacity model (default: widest replica)")] = None,
    large_share: Annotated[list[float] | None, typer.Option("--large-share", "-f", help="Share of requests sent to the large pool (repeatable)")] = None,
    simulate: Annotated[bool, typer.Option("--simulate", help="Discrete-event simulation under Poisson arrivals")] = False,
    load: Annotated[float | None, typer.Option("--load", help="Simulated offered load, requests/s (default: 80% of capacity)")] = None,
    requests: Annotated[int, typer.Option("--requests", help="Simulated arrivals", min=1000)] = 200_000,
    seed: Annotated[int, typer.Option("--seed", help="Simulation seed")] = 0,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write a PNG of throughput vs large share here")] = None,
    unit: Annotated[str, typer.Option("--unit", help="Unit of the pools' `rate`")] = "req/s",
    image: Annotated[str, typer.Option("--image", help="Container image in compose and Kubernetes files")] = "switchyard:latest",
) -> None:
    """Place a policy's pools on a cluster, check memory and fabric, project throughput, emit launch files."""
    from switchyard.cluster.capacity import CapacityError, capacity
    from switchyard.cluster.emit import EmitError, render, write
    from switchyard.cluster.local import plan_local
    from switchyard.cluster.placement import PlanError, plan_cluster
    from switchyard.cluster.report import capacity_text, placement_text, simulation_text
    from switchyard.cluster.topology import ClusterError, load_cluster
    from switchyard.policy.loader import PolicyError, load_policy

    shares = large_share or [0.5, 0.25]
    bad = [f for f in shares if not 0.0 < f < 1.0]
    if bad:
        raise _fail(f"error: --large-share must be between 0 and 1 (exclusive), got {bad[0]}")
    try:
        spec = load_policy(policy)
        base = policy.resolve().parent
        if cluster is None:
            the_plan = plan_local(spec, base)
        else:
            the_plan = plan_cluster(load_cluster(cluster), spec, base)
    except (PolicyError, ClusterError) as e:
        raise _fail(f"error: {e}") from None
    except PlanError as e:
        raise _fail("cannot place this policy on this cluster:\n" + "\n".join(f"- {i}" for i in e.issues)) from None

    summary = placement_text(the_plan)
    cap = None
    try:
        cap = capacity(the_plan, large)
        summary += "\n" + capacity_text(cap, shares, unit)
    except CapacityError as e:
        if large is not None or plot is not None or simulate:
            raise _fail(f"error: {e}") from None
        summary += f"\n\nnote: {e}"
    typer.echo(summary)

    if simulate and cap is not None:
        from switchyard.cluster.simulate import pool_loads
        from switchyard.cluster.simulate import simulate as run_sim

        f = shares[0]
        closed = cap.routed(f)
        at = run_sim(pool_loads(the_plan, cap, f), load or 0.8 * closed, requests, seed)
        sat = run_sim(pool_loads(the_plan, cap, f), SATURATION * closed, requests, seed + 1)
        typer.echo(simulation_text(f, closed, at, sat, unit))

    if emit is not None:
        parts = ["switchyard plan"]
        if cluster is not None:
            parts.append(f"--cluster {cluster.as_posix()}")
        parts += [f"--policy {policy.as_posix()}", "--emit <this folder>"]
        if image != "switchyard:latest":
            parts.append(f"--image {image}")
        try:
            written = write(emit, render(the_plan, summary, image, " ".join(parts)))
        except EmitError as e:
            raise _fail(f"error: {e}") from None
        typer.echo(f"\nwrote {len(written)} files to {emit}/")

    if plot is not None and cap is not None:
        from switchyard.cluster.plot import plot_capacity

        points = None
        if simulate:
            from switchyard.cluster.simulate import pool_loads
            from switchyard.cluster.simulate import simulate as run_sim

            points = []
            for i in range(1, 10):
                f = i / 10
                r = run_sim(pool_loads(the_plan, cap, f), SATURATION * cap.routed(f), 40_000, seed + i)
                points.append((f, r.sustained))
        title = f"{the_plan.policy.name} on {the_plan.cluster.name}"
        typer.echo(f"\nplot: {plot_capacity(cap, plot, shares, points, unit, title)}")
