"""Kubernetes: the gateway, Redis, and each pool's replicas on the nodes the plan chose.

- A pool whose replicas span several nodes is a LeaderWorkerSet (one group per replica):
  `label-nodes.sh` labels each planned node with its replica's slot (switchyard.io/slot=large-0),
  the set may only use its pool's slots, and LWS's exclusive-topology annotation puts each group
  on exactly one slot, so every group lands on the nodes the planner chose (neighbours on a
  ring). vLLM: a Ray head on the leader, the workers join it, `vllm serve` on the leader (as
  vLLM's own LWS deployment does); SGLang: every pod runs `sglang.launch_server` with its node
  rank; our engine: torchrun on every pod.
- A pool of single-node replicas is a Deployment and a Service per replica, pinned to its node
  by name, so the gateway reaches (and ejects) each replica on its own.
- Engines read /health for readiness, keep downloaded models in a host folder per runtime, and
  get HF_TOKEN from the optional Secret switchyard-hf-token. The gateway serves the policy from a
  ConfigMap with the replicas' Service URLs, with API keys on and its admin key from the Secret
  switchyard-admin (`secrets.sh` creates both).
"""

from __future__ import annotations

import json
from typing import Any

from switchyard.cluster.emit_common import (
    GATEWAY_PORT,
    HEADER,
    container_exec,
    dns_name,
    dump_yaml,
    gateway_command,
    gateway_policy,
    image_of,
    model_dir,
    secrets_script,
)
from switchyard.cluster.launch import Site, node_launch
from switchyard.cluster.placement import Plan, Replica
from switchyard.cluster.runtimes import RUNTIMES

SLOT = "switchyard.io/slot"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
ADMIN_SECRET, HF_SECRET = "switchyard-admin", "switchyard-hf-token"
MODELS_ON_HOST = "/var/cache/switchyard"
APP = {"app.kubernetes.io/name": "switchyard"}


def lws_name(pool: str) -> str:
    return dns_name("switchyard", pool)


def replica_service(rep: Replica) -> str:
    return dns_name("switchyard", rep.pool, str(rep.index))


def multi_node(plan: Plan, pool: str) -> bool:
    return len(plan.pool_replicas(pool)[0].nodes) > 1


def replica_url(plan: Plan, rep: Replica) -> str:
    if len(rep.nodes) > 1:
        # LWS names leader pods <lws>-<group> under the headless service <lws>.
        name = lws_name(rep.pool)
        return f"http://{name}-{rep.index}.{name}:{rep.port}/v1"
    return f"http://{replica_service(rep)}:{rep.port}/v1"


def _container(rep: Replica, image: str, site: Site) -> dict[str, Any]:
    runtime = RUNTIMES[rep.runtime]
    launch = node_launch(rep, site, python="python3", llama_server="/app/llama-server")
    entrypoint, args = container_exec(launch, runtime.keeps_entrypoint)
    c: dict[str, Any] = {"name": "engine", "image": image_of(rep, image)}
    if entrypoint is not None:
        c["command"] = entrypoint
    if args:
        c["args"] = args
    if runtime.hub:
        c["env"] = [{"name": "HF_TOKEN", "valueFrom": {
            "secretKeyRef": {"name": HF_SECRET, "key": "HF_TOKEN", "optional": True}}}]
    if site.is_leader:
        c["ports"] = [{"name": "http", "containerPort": rep.port}]
        # Loading a large model takes minutes: readiness only, no liveness probe to kill it meanwhile.
        c["readinessProbe"] = {"httpGet": {"path": "/health", "port": rep.port}, "periodSeconds": 10}
    if rep.device == "cuda":
        c["resources"] = {"limits": {"nvidia.com/gpu": rep.ranks_per_node}}
    c["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "models", "mountPath": runtime.cache}]
    if (folder := model_dir(rep)) is not None:
        c["volumeMounts"].append({"name": "model", "mountPath": folder, "readOnly": True})
    return c


def _volumes(rep: Replica) -> list[dict[str, Any]]:
    volumes = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
        {"name": "models", "hostPath": {"path": f"{MODELS_ON_HOST}/{rep.runtime}", "type": "DirectoryOrCreate"}},
    ]
    if (folder := model_dir(rep)) is not None:  # a model given as a path: the node's own copy
        volumes.append({"name": "model", "hostPath": {"path": folder, "type": "Directory"}})
    return volumes


def _engine_labels(rep: Replica) -> dict[str, str]:
    return {**APP, "app.kubernetes.io/component": "engine", "switchyard.io/pool": rep.pool,
            "switchyard.io/runtime": rep.runtime}


def _lws_pod(rep: Replica, image: str, slots: list[str], exclusive: bool, leader: bool) -> dict[str, Any]:
    site = Site("$(LWS_LEADER_ADDRESS)", "0" if leader else "$(LWS_WORKER_INDEX)", host="0.0.0.0")
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
        "metadata": {"labels": _engine_labels(rep)},
        "spec": {"affinity": affinity, "containers": [_container(rep, image, site)], "volumes": _volumes(rep)},
    }


def _lws_docs(plan: Plan, pool: str, image: str) -> list[dict[str, Any]]:
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
            "labels": {**APP, "switchyard.io/pool": pool},
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
                "leaderTemplate": _lws_pod(first, image, slots, exclusive, leader=True),
                "workerTemplate": _lws_pod(first, image, slots, exclusive, leader=False),
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


def _replica_docs(rep: Replica, image: str) -> list[dict[str, Any]]:
    """A single-node replica: its Deployment, pinned to the planned node, and its Service."""
    name = replica_service(rep)
    select = {**APP, "switchyard.io/replica": rep.name}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {**_engine_labels(rep), "switchyard.io/replica": rep.name}},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # the node has room for one copy of the model
            "selector": {"matchLabels": select},
            "template": {
                "metadata": {"labels": {**_engine_labels(rep), "switchyard.io/replica": rep.name}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": rep.nodes[0]},
                    "containers": [_container(rep, image, Site(rep.leader, "0", host="0.0.0.0"))],
                    "volumes": _volumes(rep),
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {**APP, "switchyard.io/pool": rep.pool}},
        "spec": {"selector": select, "ports": [{"name": "http", "port": rep.port, "targetPort": rep.port}]},
    }
    return [deployment, service]


def _gateway_docs(plan: Plan, image: str) -> list[dict[str, Any]]:
    labels = {**APP, "app.kubernetes.io/component": "gateway"}
    redis_labels = {**APP, "app.kubernetes.io/component": "redis"}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "switchyard-policy"},
            "data": {"policy.yaml": gateway_policy(plan, lambda r: replica_url(plan, r))},
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
                            "command": gateway_command("/etc/switchyard/policy.yaml",
                                                       "redis://switchyard-redis:6379/0"),
                            "env": [{"name": "SWITCHYARD_ADMIN_KEY", "valueFrom": {
                                "secretKeyRef": {"name": ADMIN_SECRET, "key": "admin-key"}}}],
                            "ports": [{"name": "http", "containerPort": GATEWAY_PORT}],
                            "readinessProbe": {"httpGet": {"path": "/health/ready", "port": GATEWAY_PORT}},
                            "livenessProbe": {"httpGet": {"path": "/health/live", "port": GATEWAY_PORT}},
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
        "# Label each node of a multi-node replica with its slot, before `kubectl apply -f switchyard.yaml`.",
        "# (Single-node replicas are pinned by node name and need no label.)",
        "set -euo pipefail",
    ]
    for rep in plan.replicas:
        if len(rep.nodes) > 1:
            for k, node in enumerate(rep.nodes):
                lines.append(f"kubectl label node {node} {SLOT}={rep.name} --overwrite  # node rank {k}")
    return "\n".join(lines) + "\n"


def k8s_files(plan: Plan, image: str) -> dict[str, str]:
    docs = _gateway_docs(plan, image)
    for pool in plan.policy.pools:
        if multi_node(plan, pool):
            docs += _lws_docs(plan, pool, image)
        else:
            for rep in plan.pool_replicas(pool):
                docs += _replica_docs(rep, image)
    head = (
        f"# {HEADER}\n"
        "# Multi-node pools need the LeaderWorkerSet controller (https://github.com/kubernetes-sigs/lws).\n"
        "# Run secrets.sh and label-nodes.sh first, then: kubectl apply -f switchyard.yaml\n"
    )
    return {
        "k8s/switchyard.yaml": head + dump_yaml(*docs),
        "k8s/label-nodes.sh": label_script(plan),
        "k8s/secrets.sh": secrets_script("k8s"),
    }
