"""Kubernetes: gateway Deployment + Service + ConfigMap, Redis, one LeaderWorkerSet per pool.

Node affinity from the plan: `label-nodes.sh` labels each planned node with its replica's
slot (switchyard.io/slot=large-0), each LeaderWorkerSet may only use its pool's slots, and
LWS's exclusive-topology annotation puts each group on exactly one slot: so every group
lands on the nodes the planner chose for one replica (neighbours on a ring).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from switchyard.cluster.emit_common import GATEWAY_PORT, HEADER, dns_name, dump_yaml, gateway_policy
from switchyard.cluster.launch import serve_args
from switchyard.cluster.placement import Plan, Replica

SLOT = "switchyard.io/slot"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


def lws_name(pool: str) -> str:
    return dns_name("switchyard", pool)


def replica_url(rep: Replica) -> str:
    # LWS names leader pods <lws>-<group> under the headless service <lws>.
    name = lws_name(rep.pool)
    return f"http://{name}-{rep.index}.{name}:{rep.port}/v1"


def _command(rep: Replica) -> list[str]:
    args = serve_args(rep, "0.0.0.0")
    if rep.tp == 1:
        return ["python", *args]
    # LWS sets these per pod; the shell expands them.
    run = (
        f"exec torchrun --nnodes $LWS_GROUP_SIZE --node-rank $LWS_WORKER_INDEX "
        f"--nproc-per-node {rep.ranks_per_node} --master-addr $LWS_LEADER_ADDRESS "
        f"--master-port {rep.master_port} {shlex.join(args)}"
    )
    return ["sh", "-c", run]


def _pod(rep: Replica, image: str, slots: list[str], exclusive: bool, leader: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "engine",
        "image": image,
        "command": _command(rep),
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
    }
    if rep.device == "cuda":
        container["resources"] = {"limits": {"nvidia.com/gpu": rep.ranks_per_node}}
    if leader:
        container["ports"] = [{"name": "http", "containerPort": rep.port}]
        container["readinessProbe"] = {"httpGet": {"path": "/health", "port": rep.port}, "periodSeconds": 10}
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": SLOT, "operator": "In", "values": slots}]}]
            }
        }
    }
    if exclusive:
        # One engine pod per node, as planned: a node's memory is budgeted for one replica.
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app.kubernetes.io/component": "engine"}},
                 "topologyKey": "kubernetes.io/hostname"}
            ]
        }  # fmt: skip
    return {
        "metadata": {"labels": {"app.kubernetes.io/name": "switchyard", "app.kubernetes.io/component": "engine",
                                "switchyard.io/pool": rep.pool}},
        "spec": {
            "affinity": affinity,
            "containers": [container],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
        },
    }  # fmt: skip


def _pool_docs(plan: Plan, pool: str, image: str) -> list[dict[str, Any]]:
    reps = plan.pool_replicas(pool)
    first = reps[0]
    name = lws_name(pool)
    slots = [r.name for r in reps]
    placement = {
        r.name: [{"node": node, "node_rank": k, "ranks": list(r.ranks_on(k))} for k, node in enumerate(r.nodes)]
        for r in reps
    }
    exclusive = not plan.cluster.share_nodes
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "switchyard", "switchyard.io/pool": pool},
            "annotations": {
                "leaderworkerset.sigs.k8s.io/exclusive-topology": SLOT,
                "switchyard.io/placement": json.dumps(placement, separators=(",", ":")),
            },
        },
        "spec": {
            "replicas": len(reps),
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": len(first.nodes),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _pod(first, image, slots, exclusive, leader=True),
                "workerTemplate": _pod(first, image, slots, exclusive, leader=False),
            },
        },
    }
    leaders = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-leaders"},
        "spec": {
            "selector": {LWS_NAME: name, "leaderworkerset.sigs.k8s.io/worker-index": "0"},
            "ports": [{"name": "http", "port": first.port, "targetPort": first.port}],
        },
    }
    return [lws, leaders]


def _gateway_docs(plan: Plan, image: str) -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": "switchyard", "app.kubernetes.io/component": "gateway"}
    redis_labels = {"app.kubernetes.io/name": "switchyard", "app.kubernetes.io/component": "redis"}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "switchyard-policy"},
            "data": {"policy.yaml": gateway_policy(plan, replica_url)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "switchyard-gateway", "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [{
                            "name": "gateway",
                            "image": image,
                            "command": ["python", "-m", "switchyard.cli", "serve", "--policy",
                                        "/etc/switchyard/policy.yaml", "--host", "0.0.0.0", "--port",
                                        str(GATEWAY_PORT), "--redis", "redis://switchyard-redis:6379/0"],
                            "ports": [{"name": "http", "containerPort": GATEWAY_PORT}],
                            "readinessProbe": {"httpGet": {"path": "/health", "port": GATEWAY_PORT}},
                            "volumeMounts": [{"name": "policy", "mountPath": "/etc/switchyard"}],
                        }],
                        "volumes": [{"name": "policy", "configMap": {"name": "switchyard-policy"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "switchyard-gateway"},
            "spec": {"selector": labels, "ports": [{"name": "http", "port": GATEWAY_PORT}]},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "switchyard-redis", "labels": redis_labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": redis_labels},
                "template": {
                    "metadata": {"labels": redis_labels},
                    "spec": {"containers": [{"name": "redis", "image": "redis:7-alpine",
                                             "ports": [{"containerPort": 6379}]}]},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "switchyard-redis"},
            "spec": {"selector": redis_labels, "ports": [{"port": 6379}]},
        },
    ]  # fmt: skip


def label_script(plan: Plan) -> str:
    lines = [
        "#!/usr/bin/env bash",
        f"# {HEADER}",
        "# Label each planned node with its replica slot, before `kubectl apply -f switchyard.yaml`.",
        "set -euo pipefail",
    ]
    for rep in plan.replicas:
        for k, node in enumerate(rep.nodes):
            lines.append(f"kubectl label node {node} {SLOT}={rep.name} --overwrite  # node rank {k}")
    return "\n".join(lines) + "\n"


def k8s_files(plan: Plan, image: str) -> dict[str, str]:
    docs = _gateway_docs(plan, image)
    for pool in plan.policy.pools:
        docs += _pool_docs(plan, pool, image)
    head = (
        f"# {HEADER}\n"
        "# Needs the LeaderWorkerSet controller (https://github.com/kubernetes-sigs/lws).\n"
        "# Run label-nodes.sh first, then: kubectl apply -f switchyard.yaml\n"
    )
    body = dump_yaml(*docs)
    return {"k8s/switchyard.yaml": head + body, "k8s/label-nodes.sh": label_script(plan)}
