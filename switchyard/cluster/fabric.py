"""Fabric rules: which replica shapes a switch or a ring can carry, and which collective.

The rule on a ring, precisely: a ring all-reduce over a replica's nodes sends each node's
data to the next node of the replica and the last back to the first. On a physical ring
those hops are direct links only when the replica spans 1 node, 2 neighbouring nodes, or
the whole ring. Any other group (3 of 4 nodes, 2 groups of 4 on 8 nodes) needs a hop
between non-neighbours, whose traffic would cross nodes of other replicas: refused.
The one-shot collective sends every rank's data to every other rank: on more than one
node it needs a switch.
"""

from __future__ import annotations

from switchyard.cluster.topology import Cluster


def ring_problem(cluster: Cluster, replica: str, nodes: list[str]) -> str | None:
    """Why this replica's node group cannot run on the cluster's ring, or None when it can."""
    if cluster.fabric != "ring" or len(nodes) == 1 or len(nodes) == len(cluster.nodes):
        return None
    n = len(cluster.nodes)
    if len(nodes) == 2 and cluster.neighbours(nodes[0], nodes[1]):
        return None
    gap = next(
        ((a, b) for a, b in zip(nodes, nodes[1:] + nodes[:1], strict=True) if not cluster.neighbours(a, b)),
        (nodes[-1], nodes[0]),
    )
    return (
        f"replica {replica} spans {len(nodes)} of the ring's {n} nodes ({', '.join(nodes)}): its ring "
        f"all-reduce needs {gap[0]} -> {gap[1]}, which are not neighbours on the ring, so that traffic "
        f"would cross nodes outside the replica. On a ring a replica must span 1 node, 2 neighbouring "
        f"nodes or all {n} nodes. Use `fabric: switch` for independent groups of {len(nodes)}, or set "
        f"nodes_per_replica to {n} (one model over the whole ring) or to 2 or 1."
    )


def resolve_collective(cluster: Cluster, pool: str, requested: str, span: int) -> tuple[str, str | None, str | None]:
    """The collective to launch with -> (collective, error, note)."""
    if span == 1 or cluster.fabric == "switch":
        return requested, None, None
    if requested == "oneshot":
        return requested, (
            f"pool {pool}: collective `oneshot` needs every node of a replica to reach every other "
            f"directly, which only a switch gives; this ring links each node to its 2 neighbours. "
            f"Use `collective: ring` (or `auto`) in the pool's engine section, or a switch fabric."
        ), None
    if requested == "auto":
        # auto's start-up test would pick ring anyway on a ring; launching ring says so up front.
        return "ring", None, f"pool {pool}: collective auto -> ring (the one-shot backend needs a switch)"
    return requested, None, None
