"""Launch commands for engine replicas: `switchyard engine serve`, under torchrun when TP > 1.

torchrun sets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE; the engine joins with env://.
"""

from __future__ import annotations

from switchyard.cluster.placement import Replica


def engine_serve(rep: Replica, host: str | None = None, python: str = "python") -> list[str]:
    """`python -m switchyard.cli engine serve ...` for one rank process (no torchrun prefix)."""
    return [python, *serve_args(rep, host)]


def serve_args(rep: Replica, host: str | None) -> list[str]:
    return [
        "-m", "switchyard.cli", "engine", "serve",
        "--model", rep.model,
        "--tp", str(rep.tp),
        "--collective", rep.collective,
        "--port", str(rep.port),
        "--host", host or rep.bind_host,
        "--device", rep.device,
        *rep.args,
    ]  # fmt: skip


def node_command(
    rep: Replica,
    node_rank: int,
    master_addr: str | None = None,
    host: str | None = None,
    python: str = "python",
    torchrun: tuple[str, ...] = ("torchrun",),
) -> list[str]:
    """What the replica's node_rank-th node runs: one process, or torchrun for all its ranks."""
    if rep.tp == 1:
        return engine_serve(rep, host, python)
    if len(rep.nodes) == 1:
        # One node: --standalone finds a free rendezvous port, so replicas never collide.
        head = [*torchrun, "--standalone", "--nnodes", "1", "--nproc-per-node", str(rep.ranks_per_node)]
    else:
        head = [
            *torchrun,
            "--nnodes", str(len(rep.nodes)),
            "--node-rank", str(node_rank),
            "--nproc-per-node", str(rep.ranks_per_node),
            "--master-addr", master_addr or rep.leader,
            "--master-port", str(rep.master_port),
        ]  # fmt: skip
    return [*head, *serve_args(rep, host)]
