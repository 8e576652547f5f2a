"""Cluster files: the nodes (name, address, memory, GPUs, NICs) and the fabric that joins them.

A `switch` fabric lets every node reach every other directly. A `ring` fabric links each
node to its two neighbours only; its order is the `ring:` list, or the order of `nodes:`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ClusterError(Exception):
    """A cluster file that cannot be used; `issues` holds every problem, each with its line."""

    def __init__(self, issues: list[str]):
        self.issues = issues
        super().__init__("\n".join(issues))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Node(_Strict):
    name: str = Field(min_length=1, description="Node name (Kubernetes node name, script name)")
    address: str = Field(min_length=1, description="IP or host name the other nodes reach it at")
    memory_gb: float | None = Field(None, gt=0, description="Memory for weights + KV cache (default: cluster's)")
    gpus: int | None = Field(None, ge=0, description="Accelerators on this node (default: cluster's)")
    nics: list[str] = Field(default_factory=list, description="Network interfaces for the collectives")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        import re

        # Node names become file names, compose service names and Kubernetes label values.
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", v):
            raise ValueError(f"node name {v!r}: use letters, digits, '.', '-', '_' (max 63)")
        return v


class Cluster(_Strict):
    name: str = Field("cluster", description="Shown in plans and generated files")
    fabric: Literal["switch", "ring"] = Field(description="switch: all-to-all; ring: neighbours only")
    memory_gb: float = Field(128.0, gt=0, description="Default memory per node, GB")
    reserve_gb: float = Field(0.0, ge=0, description="Memory per node kept for the OS and runtime, GB")
    gpus: int = Field(1, ge=0, description="Default accelerators per node")
    device: Literal["cpu", "cuda"] = Field("cuda", description="Engine device when a pool does not say")
    engine_port: int = Field(8000, ge=1, le=65535, description="HTTP port of each replica's leader")
    master_port: int = Field(29500, ge=1, le=65535, description="torch.distributed rendezvous port")
    share_nodes: bool = Field(False, description="Let several replicas share a node (one-machine setups)")
    nodes: list[Node] = Field(min_length=1)
    ring: list[str] | None = Field(None, description="Ring order by node name (default: order of nodes)")

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        names = [n.name for n in self.nodes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"node {dup[0]!r} listed twice; node names must be unique")
        addrs = [n.address for n in self.nodes]
        dup = sorted({a for a in addrs if addrs.count(a) > 1})
        if dup and not self.share_nodes:
            raise ValueError(f"address {dup[0]!r} used by two nodes; each node needs its own address")
        if self.ring is not None:
            if self.fabric != "ring":
                raise ValueError("`ring:` gives a ring's order; it needs `fabric: ring`")
            if sorted(self.ring) != sorted(names):
                missing = sorted(set(names) - set(self.ring))
                extra = sorted(set(self.ring) - set(names))
                raise ValueError(
                    "`ring:` must list every node exactly once"
                    + (f"; missing {missing}" if missing else "")
                    + (f"; unknown {extra}" if extra else "")
                    + ("; a node is repeated" if not missing and not extra else "")
                )
        if self.fabric == "ring" and len(self.nodes) < 2:
            raise ValueError("a ring needs at least 2 nodes; a single node is `fabric: switch`")
        return self

    @property
    def order(self) -> list[Node]:
        """Nodes in placement order: the ring's order on a ring, else as listed."""
        if self.ring is None:
            return list(self.nodes)
        by_name = {n.name: n for n in self.nodes}
        return [by_name[name] for name in self.ring]

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def memory_of(self, node: Node) -> float:
        return node.memory_gb if node.memory_gb is not None else self.memory_gb

    def gpus_of(self, node: Node) -> int:
        return node.gpus if node.gpus is not None else self.gpus

    def neighbours(self, a: str, b: str) -> bool:
        """True when a and b are linked directly (always on a switch; adjacent on a ring)."""
        if a == b or self.fabric == "switch":
            return True
        order = [n.name for n in self.order]
        i, j = order.index(a), order.index(b)
        return abs(i - j) in (1, len(order) - 1)


def local_cluster(memory_gb: float = 1e6, device: Literal["cpu", "cuda"] = "cpu") -> Cluster:
    """This machine as a one-node cluster whose replicas share the node (`switchyard up`)."""
    return Cluster(
        name="local",
        fabric="switch",
        memory_gb=memory_gb,
        gpus=0 if device == "cpu" else 1,
        device=device,
        share_nodes=True,
        nodes=[Node(name="local", address="127.0.0.1")],
    )


def _lines(node: yaml.Node, path: tuple = (), out: dict[tuple, int] | None = None) -> dict[tuple, int]:
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            _lines(v, path + (str(k.value),), out)
            out[path + (str(k.value),)] = k.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, path + (i,), out)
    return out


def parse_cluster(text: str, file: str = "<cluster>") -> Cluster:
    """Parse and validate a cluster file; raise ClusterError naming file:line for each problem."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data: Any = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise ClusterError([f"{file}:{mark.line + 1 if mark else 1}: YAML syntax: {e.problem or e}"]) from None
    except yaml.YAMLError as e:
        raise ClusterError([f"{file}:1: YAML: {e}"]) from None
    if not isinstance(data, dict) or node is None:
        raise ClusterError([f"{file}:1: a cluster file is a mapping (name, fabric, nodes, ...)"])
    lines = _lines(node)
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        issues = []
        for err in e.errors(include_url=False):
            loc = tuple(err["loc"])
            key = loc
            while key and key not in lines:
                key = key[:-1]
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
            msg = f"unknown key {loc[-1]!r}" if err["type"] == "extra_forbidden" else err["msg"]
            msg = msg.removeprefix("Value error, ")
            issues.append(f"{file}:{lines.get(key, 1)}: {where + ': ' if where else ''}{msg}")
        raise ClusterError(issues) from None


def load_cluster(path: str | Path) -> Cluster:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ClusterError([f"{p}: cannot read: {e.strerror or e}"]) from None
    return parse_cluster(text, str(p))
