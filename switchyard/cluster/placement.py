"""Placement: each pool's replicas onto whole groups of nodes, then the fabric and memory checks.

Replicas are laid out in the cluster's order (the ring's order on a ring), widest pools
first, each on a contiguous run of nodes; so on a ring every 2-node replica sits on
neighbours. Every problem found is collected, so one run shows them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from switchyard.cluster.fabric import resolve_collective, ring_problem
from switchyard.cluster.memory import model_size_gb, per_node_gb
from switchyard.cluster.model_check import tp_problem
from switchyard.cluster.runtimes import parallelism
from switchyard.cluster.topology import Cluster
from switchyard.policy.schema import PolicySpec, PoolSpec


class PlanError(Exception):
    """A policy that cannot be placed on a cluster; each issue says why and what to do."""

    def __init__(self, issues: list[str]):
        self.issues = issues
        super().__init__("\n".join(issues))


@dataclass(frozen=True)
class Replica:
    pool: str
    index: int
    nodes: tuple[str, ...]
    addresses: tuple[str, ...]
    ranks_per_node: int
    model: str
    device: str
    collective: str
    args: tuple[str, ...]
    port: int
    master_port: int
    bind_host: str
    nics: tuple[tuple[str, ...], ...] = ()
    runtime: str = "switchyard"
    pp: int = 1  # vllm: pipeline stages; the replica's ranks are tensor_parallel x pp
    image: str | None = None  # engine.image: the container image when not the runtime's default
    served_name: str = ""  # the pool's model name, which the gateway sends upstream

    @property
    def name(self) -> str:
        return f"{self.pool}-{self.index}"

    @property
    def tp(self) -> int:
        """Every rank of the replica (our engine and SGLang shard the model over all of them)."""
        return len(self.nodes) * self.ranks_per_node

    @property
    def tensor_parallel(self) -> int:
        return self.tp // self.pp

    @property
    def leader(self) -> str:
        return self.addresses[0]

    @property
    def url(self) -> str:
        return f"http://{self.leader}:{self.port}/v1"

    def ranks_on(self, node_rank: int) -> range:
        """Global ranks (0..tp-1) run by the replica's node_rank-th node."""
        return range(node_rank * self.ranks_per_node, (node_rank + 1) * self.ranks_per_node)


@dataclass
class NodeUse:
    node: str
    memory_gb: float
    reserve_gb: float
    used_gb: float = 0.0
    parts: list[str] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)


@dataclass
class Plan:
    cluster: Cluster
    policy: PolicySpec
    replicas: list[Replica]
    usage: dict[str, NodeUse]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sized: dict[str, float] = field(default_factory=dict)

    def pool_replicas(self, pool: str) -> list[Replica]:
        return [r for r in self.replicas if r.pool == pool]

    def on_node(self, node: str) -> list[tuple[Replica, int]]:
        """(replica, node_rank) for every replica with ranks on this node."""
        return [(r, r.nodes.index(node)) for r in self.replicas if node in r.nodes]


@dataclass(frozen=True)
class _Shape:
    nodes_per_replica: int
    ranks_per_node: int
    model: str
    device: str
    collective: str
    args: tuple[str, ...]
    runtime: str
    pp: int
    image: str | None


def _shape(name: str, pool: PoolSpec, cluster: Cluster, errors: list[str]) -> _Shape:
    eng = pool.engine
    device = eng.device if eng and "device" in eng.model_fields_set else cluster.device
    par = parallelism(name, eng, pool.nodes_per_replica, pool.ranks_per_node, device, errors)
    return _Shape(
        nodes_per_replica=pool.nodes_per_replica,
        ranks_per_node=par.ranks_per_node,
        model=eng.model if eng else pool.model,
        device=device,
        collective=eng.collective if eng else "auto",
        args=tuple(eng.args) if eng else (),
        runtime=eng.runtime if eng else "switchyard",
        pp=par.pp,
        image=eng.image if eng else None,
    )


def _url_port(pool: PoolSpec, i: int) -> int | None:
    if isinstance(pool.replicas, list) and i < len(pool.replicas):
        return urlsplit(pool.replicas[i].url).port
    return None


def plan_cluster(cluster: Cluster, policy: PolicySpec, base: Path | None = None) -> Plan:
    """Place every pool's replicas on the cluster; raise PlanError listing every problem."""
    errors: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    shapes = {name: _shape(name, pool, cluster, errors) for name, pool in policy.pools.items()}
    order = cluster.order
    n = len(order)

    for name, s in shapes.items():
        if s.nodes_per_replica > n:
            errors.append(
                f"pool {name}: a replica spans {s.nodes_per_replica} nodes but cluster {cluster.name} has "
                f"{n}; lower nodes_per_replica or add nodes"
            )
    demand = {name: policy.pools[name].replica_count * s.nodes_per_replica for name, s in shapes.items()}
    if not cluster.share_nodes and sum(demand.values()) > n:
        parts = ", ".join(
            f"{name}: {policy.pools[name].replica_count} x {shapes[name].nodes_per_replica}" for name in shapes
        )
        count = sum(p.replica_count for p in policy.pools.values())
        errors.append(
            f"the policy asks for {count} replicas needing {sum(demand.values())} nodes ({parts}) but "
            f"cluster {cluster.name} has {n} nodes, and each node runs one replica. Remove replicas, lower "
            f"nodes_per_replica, or add nodes."
        )
    if errors:
        raise PlanError(errors)

    usage = {
        node.name: NodeUse(node.name, cluster.memory_of(node), cluster.reserve_gb) for node in cluster.nodes
    }
    sizes: dict[str, float] = {}
    for name, pool in policy.pools.items():
        size, _ = model_size_gb(pool, base)
        if size is None:
            warnings.append(
                f"pool {name}: model size unknown, memory not checked (give model_size_gb, or model_file)"
            )
        else:
            sizes[name] = size
        if isinstance(pool.replicas, list) and not cluster.share_nodes:
            notes.append(f"pool {name}: its listed URLs are replaced by the planned leaders' URLs")

    replicas: list[Replica] = []
    cursor = 0
    per_node_count = dict.fromkeys(usage, 0)
    # Widest pools first: contiguous runs of wide groups, then the single nodes.
    for name in sorted(shapes, key=lambda p: -shapes[p].nodes_per_replica):
        s, pool = shapes[name], policy.pools[name]
        collective = s.collective
        if s.runtime == "switchyard":  # the one-shot rule and the head count are our engine's
            collective, err, note = resolve_collective(cluster, name, s.collective, s.nodes_per_replica)
            found = [(err, note)]
            if pool.engine is not None:
                found.append(tp_problem(name, s.model, s.nodes_per_replica * s.ranks_per_node, base))
            errors += [e for e, _ in found if e]
            notes += [n for _, n in found if n]
        for i in range(pool.replica_count):
            group = [order[(cursor + k) % n] for k in range(s.nodes_per_replica)]
            cursor = (cursor + s.nodes_per_replica) % n if cluster.share_nodes else cursor + s.nodes_per_replica
            slot = per_node_count[group[0].name]
            for node in group:
                per_node_count[node.name] += 1
            port = _url_port(pool, i) if cluster.share_nodes else None
            rep = Replica(
                pool=name,
                index=i,
                nodes=tuple(x.name for x in group),
                addresses=tuple(x.address for x in group),
                ranks_per_node=s.ranks_per_node,
                model=s.model,
                device=s.device,
                collective=collective,
                args=s.args,
                port=port or cluster.engine_port + slot,
                master_port=cluster.master_port + slot,
                bind_host="127.0.0.1" if cluster.share_nodes else "0.0.0.0",
                nics=tuple(tuple(x.nics) for x in group),
                runtime=s.runtime,
                pp=s.pp,
                image=s.image,
                served_name=pool.model,
            )
            replicas.append(rep)
            problem = ring_problem(cluster, rep.name, list(rep.nodes))
            if problem:
                errors.append(f"pool {name}: {problem}")
            for node in group:
                use = usage[node.name]
                use.replicas.append(rep.name)
                if s.device == "cuda" and s.ranks_per_node > cluster.gpus_of(node):
                    errors.append(
                        f"pool {name}: ranks_per_node {s.ranks_per_node} but node {node.name} has "
                        f"{cluster.gpus_of(node)} GPU(s); lower ranks_per_node or set the node's `gpus`"
                    )
                if name in sizes:
                    w = sizes[name] / s.nodes_per_replica
                    use.used_gb += per_node_gb(sizes[name], s.nodes_per_replica, pool.kv_cache_gb)
                    use.parts.append(
                        f"{rep.name}: {w:.1f} GB weights ({sizes[name]:.1f} GB / {s.nodes_per_replica} "
                        f"node{'s' if s.nodes_per_replica > 1 else ''}) + {pool.kv_cache_gb:.1f} GB KV cache"
                    )
    # A replica's ports must be free on its leader; on shared nodes two pools may name the same one.
    seen: dict[tuple[str, int], str] = {}
    for rep in replicas:
        key = (rep.leader, rep.port)
        if key in seen:
            errors.append(
                f"replicas {seen[key]} and {rep.name} both serve on {rep.leader}:{rep.port}; give them "
                f"different ports"
            )
        seen[key] = rep.name

    for use in usage.values():
        need = use.used_gb + use.reserve_gb
        if need > use.memory_gb + 1e-9:
            reserve = f" + {use.reserve_gb:.1f} GB reserve" if use.reserve_gb else ""
            errors.append(
                f"node {use.node} runs out of memory: needs {need:.1f} GB ({'; '.join(use.parts)}{reserve}) "
                f"but has {use.memory_gb:.1f} GB. Spread the model over more nodes (nodes_per_replica), "
                f"lower kv_cache_gb, or use a smaller (quantized) model."
            )
        elif use.used_gb and need > 0.9 * use.memory_gb:
            warnings.append(f"node {use.node}: {need:.1f} of {use.memory_gb:.1f} GB in use (over 90%)")
    idle = [u.node for u in usage.values() if not u.replicas]
    if idle:
        warnings.append(f"idle nodes: {', '.join(idle)}")
    if errors:
        raise PlanError(errors)
    return Plan(cluster, policy, replicas, usage, warnings, notes, sizes)
