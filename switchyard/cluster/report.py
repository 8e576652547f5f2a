"""Plain-text rendering of a plan and its capacity figures (the CLI prints it, docs/deploy.md quotes it)."""

from __future__ import annotations

from switchyard.cluster.capacity import Capacity, fmt_ratio
from switchyard.cluster.placement import Plan, Replica
from switchyard.cluster.simulate import SimResult


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def runtime_text(rep: Replica) -> str:
    if rep.runtime == "switchyard":
        return f"switchyard {rep.collective} (tp {rep.tp})"
    if rep.runtime == "vllm":
        return f"vllm (tp {rep.tensor_parallel} x pp {rep.pp})"
    if rep.runtime == "sglang":
        return f"sglang (tp {rep.tp})"
    return rep.runtime


def placement_text(plan: Plan) -> str:
    c = plan.cluster
    pools = ", ".join(
        f"{name} ({len(plan.pool_replicas(name))} x {spec.nodes_per_replica} node"
        f"{'s' if spec.nodes_per_replica > 1 else ''})"
        for name, spec in plan.policy.pools.items()
    )
    lines = [
        f"cluster {c.name}: {len(c.nodes)} node(s), {c.fabric} fabric" + (f" (ring order: "
        f"{' - '.join(n.name for n in c.order)})" if c.fabric == "ring" else ""),  # fmt: skip
        f"policy {plan.policy.name}: {pools}",
        "",
        "placement:",
    ]
    rows = [["replica", "node", "address", "node rank", "ranks", "memory GB", "runtime", "serves"]]
    for rep in plan.replicas:
        for k, node in enumerate(rep.nodes):
            use = plan.usage[node]
            mem = f"{use.used_gb + use.reserve_gb:.1f}/{use.memory_gb:g}" if rep.pool in plan.sized else "?"
            ranks = rep.ranks_on(k)
            rows.append([
                rep.name if k == 0 else "",
                node,
                rep.addresses[k],
                f"{k}/{len(rep.nodes)}",
                f"{ranks.start}" if len(ranks) == 1 else f"{ranks.start}-{ranks.stop - 1}",
                mem,
                runtime_text(rep) if k == 0 else "",
                rep.url if k == 0 else "",
            ])  # fmt: skip
    lines += _table(rows)
    for w in plan.warnings:
        lines.append(f"warning: {w}")
    for n in plan.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def capacity_text(cap: Capacity, shares: list[float], unit: str) -> str:
    lines = [
        "",
        f"capacity (large pool: {cap.large_pool}; rate per replica in {unit}):",
        f"  large  {cap.large_replicas} x {cap.large_rate:g} = {cap.large_cap:g} {unit}",
        f"  small  {cap.small_detail} = {cap.small_cap:g} {unit} ({', '.join(cap.small_pools) or 'no other pool'})",
        f"  baseline (large only)  {cap.baseline_replicas} x {cap.large_rate:g} = {cap.baseline_cap:g} {unit}",
    ]
    for f in shares:
        lines.append(
            f"  f = {f:g}: routed {cap.routed(f):.4g} {unit} = {fmt_ratio(cap.speedup(f))} the baseline "
            f"(bottleneck: {cap.bottleneck(f)} pool)"
        )
    return "\n".join(lines)


def simulation_text(f: float, closed: float, at_load: SimResult, saturated: SimResult, unit: str) -> str:
    gap = (saturated.sustained - closed) / closed * 100
    lines = [
        "",
        f"simulation (f = {f:g}, Poisson arrivals, M/M/c per pool, {at_load.requests} requests):",
        f"  at load {at_load.load:.4g} {unit}: throughput {at_load.throughput:.4g} {unit}, "
        f"p50 {at_load.p50:.3g} s, p99 {at_load.p99:.3g} s",
    ]
    for p in at_load.pools:
        lines.append(
            f"    {p.name}: {p.throughput:.4g} {unit} of {p.capacity:g}, utilization {p.utilization:.0%}, "
            f"p99 {p.p99:.3g} s"
        )
    lines.append(
        f"  saturation (offered {saturated.load:.4g} {unit}): sustained {saturated.sustained:.4g} {unit} "
        f"vs closed form {closed:.4g} ({gap:+.1f}%)"
    )
    return "\n".join(lines)
