"""What one node runs for its part of a replica, for every runtime.

Most launches are one command: `switchyard engine serve` (under torchrun when TP > 1; torchrun
sets MASTER_ADDR/RANK/WORLD_SIZE and the engine joins with env://), `python3 -m
sglang.launch_server` with its node rank, `llama-server`, or `vllm serve` on one node. vLLM
across nodes takes three steps, as its own multi-node scripts do: the leader starts a Ray
head, waits until every node's GPUs have joined, then serves; each worker joins the head
(retrying until the head is up). A Site says how this node names the leader: its address on
bare metal, a service name in compose, LeaderWorkerSet's variables on Kubernetes.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from switchyard.cluster.placement import Replica

# A Ray cluster's GPU count, from the leader: exit 0 once `need` GPUs have joined.
_RAY_READY = ('import sys, ray; ray.init(address="auto", logging_level="ERROR"); '
              'sys.exit(ray.cluster_resources().get("GPU", 0) < {need})')


@dataclass(frozen=True)
class Site:
    """How one node of a replica finds the others."""

    leader: str  # the replica's leader, as this node reaches it
    node_rank: str = "0"  # this node's rank in the replica ("$(LWS_WORKER_INDEX)" on Kubernetes workers)
    host: str | None = None  # bind address of the leader's HTTP server (default: the plan's)
    node_address: str | None = None  # this node's own address, where the plan knows it (bare metal)

    @property
    def is_leader(self) -> bool:
        return self.node_rank == "0"


@dataclass(frozen=True)
class NodeLaunch:
    """Steps in order: `before`, then `wait` retried until it succeeds, then `main` (retried too when
    `retry`: a worker joining a head that may not be up yet)."""

    main: tuple[str, ...]
    before: tuple[tuple[str, ...], ...] = ()
    wait: tuple[str, ...] | None = None
    wait_for: str = ""
    retry: bool = False
    env: dict[str, str] = field(default_factory=dict)

    @property
    def single(self) -> bool:
        """One command: containers run it as it is, without a shell."""
        return not self.before and self.wait is None and not self.retry

    def script(self, fmt=shlex.join) -> list[str]:
        """The launch as shell lines; `fmt` renders a command (one line, or several)."""
        lines = [fmt(list(cmd)) for cmd in self.before]
        if self.wait is not None:
            lines.append(f"until {shlex.join(self.wait)} >/dev/null 2>&1; do "
                         f"echo {shlex.quote('waiting for ' + self.wait_for)}; sleep 5; done")
        if self.retry:
            lines.append(f"until {fmt(list(self.main))}; do echo 'retrying in 5 s'; sleep 5; done")
        else:
            lines.append("exec " + fmt(list(self.main)))
        return lines


def serve_args(rep: Replica, host: str | None) -> list[str]:
    """`switchyard engine serve`'s arguments after the interpreter (`-m switchyard.cli ...`)."""
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


def engine_serve(rep: Replica, host: str | None = None, python: str = "python") -> list[str]:
    """`python -m switchyard.cli engine serve ...` for one rank process (no torchrun prefix)."""
    return [python, *serve_args(rep, host)]


def node_command(
    rep: Replica,
    node_rank: int | str,
    master_addr: str | None = None,
    host: str | None = None,
    python: str = "python",
    torchrun: tuple[str, ...] = ("torchrun",),
) -> list[str]:
    """Our engine on the replica's node_rank-th node: one process, or torchrun for all its ranks."""
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


def model_flag(model: str) -> list[str]:
    """llama-server's model: a GGUF file (`-m`), else a Hugging Face repo[:quant] it downloads (`-hf`)."""
    is_file = model.endswith(".gguf") or model.startswith(("/", "./", "../", "~"))
    return ["-m", model] if is_file else ["-hf", model]


def _vllm(rep: Replica, site: Site, host: str) -> NodeLaunch:
    multi = len(rep.nodes) > 1
    serve = ["vllm", "serve", rep.model, "--host", host, "--port", str(rep.port),
             "--served-model-name", rep.served_name, "--tensor-parallel-size", str(rep.tensor_parallel)]
    if rep.pp > 1:
        serve += ["--pipeline-parallel-size", str(rep.pp)]
    if not multi:
        return NodeLaunch(tuple(serve + list(rep.args)))
    serve += ["--distributed-executor-backend", "ray", *rep.args]
    env = {"VLLM_HOST_IP": site.node_address} if site.node_address else {}
    own_ip = [f"--node-ip-address={site.node_address}"] if site.node_address else []
    if not site.is_leader:
        join = ("ray", "start", f"--address={site.leader}:{rep.master_port}", *own_ip, "--block")
        return NodeLaunch(join, retry=True, env=env)
    head = ("ray", "start", "--head", f"--port={rep.master_port}", *own_ip)
    ready = ("python3", "-c", _RAY_READY.format(need=rep.tp))
    return NodeLaunch(tuple(serve), before=(head,), wait=ready,
                      wait_for=f"{rep.tp} GPUs of {len(rep.nodes)} nodes to join the Ray cluster", env=env)


def _sglang(rep: Replica, site: Site, host: str) -> NodeLaunch:
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", rep.model,
            "--served-model-name", rep.served_name, "--host", host, "--port", str(rep.port), "--tp", str(rep.tp)]
    if len(rep.nodes) > 1:
        argv += ["--nnodes", str(len(rep.nodes)), "--node-rank", site.node_rank,
                 "--dist-init-addr", f"{site.leader}:{rep.master_port}"]
    return NodeLaunch(tuple(argv + list(rep.args)))


def _llama_cpp(rep: Replica, host: str, binary: str) -> NodeLaunch:
    # --jinja: the model's own chat template, which is what renders `tools` and parses tool calls.
    return NodeLaunch((binary, *model_flag(rep.model), "--alias", rep.served_name, "--host", host,
                       "--port", str(rep.port), "--jinja", *rep.args))


def node_launch(rep: Replica, site: Site, python: str = "python", llama_server: str = "llama-server") -> NodeLaunch:
    """What the node at `site` runs for replica `rep`, whatever its runtime."""
    host = site.host or rep.bind_host
    if rep.runtime == "vllm":
        return _vllm(rep, site, host)
    if rep.runtime == "sglang":
        return _sglang(rep, site, host)
    if rep.runtime == "llama.cpp":
        return _llama_cpp(rep, host, llama_server)
    leader = site.leader if len(rep.nodes) > 1 else None
    return NodeLaunch(tuple(node_command(rep, site.node_rank, master_addr=leader, host=host, python=python)))
