"""docker compose for one host: Redis, the gateway, and one service per node of each replica.

Each planned node of a replica becomes a container; ranks rendezvous at the leader's
service name, as they would at the leader's address on the cluster.
"""

from __future__ import annotations

from typing import Any

from switchyard.cluster.emit_common import GATEWAY_PORT, HEADER, dns_name, dump_yaml, gateway_policy
from switchyard.cluster.launch import node_command
from switchyard.cluster.placement import Plan, Replica

POLICY_IN_CONTAINER = "/etc/switchyard/policy.yaml"


def service_name(rep: Replica, node_rank: int) -> str:
    return dns_name(rep.pool, str(rep.index), f"n{node_rank}")


def _engine_service(rep: Replica, k: int, image: str) -> dict[str, Any]:
    leader = service_name(rep, 0)
    svc: dict[str, Any] = {
        "image": image,
        "hostname": service_name(rep, k),
        "command": node_command(rep, k, master_addr=leader if len(rep.nodes) > 1 else None, host="0.0.0.0"),
        "labels": {
            "switchyard.replica": rep.name,
            "switchyard.node-rank": str(k),
            "switchyard.ranks": ",".join(str(r) for r in rep.ranks_on(k)),
            "switchyard.planned-node": rep.nodes[k],
        },
        "volumes": ["models:/root/.cache/switchyard"],
        "shm_size": "8gb",  # torch.distributed's shared-memory transport needs more than docker's 64 MB
        "restart": "unless-stopped",
    }
    if rep.device == "cuda":
        svc["deploy"] = {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "count": rep.ranks_per_node, "capabilities": ["gpu"]}]
                }
            }
        }
    if k == 0:
        svc["healthcheck"] = {
            "test": ["CMD", "python", "-c",
                     f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{rep.port}/health')"],
            "interval": "10s",
            "start_period": "300s",
        }  # fmt: skip
    return svc


def compose_files(plan: Plan, image: str) -> dict[str, str]:
    services: dict[str, Any] = {
        "redis": {
            "image": "redis:7-alpine",
            "restart": "unless-stopped",
            "healthcheck": {"test": ["CMD", "redis-cli", "ping"], "interval": "5s"},
        }
    }
    engines: dict[str, Any] = {}
    for rep in plan.replicas:
        for k in range(len(rep.nodes)):
            engines[service_name(rep, k)] = _engine_service(rep, k, image)
    services["gateway"] = {
        "image": image,
        "command": [
            "python", "-m", "switchyard.cli", "serve", "--policy", POLICY_IN_CONTAINER,
            "--host", "0.0.0.0", "--port", str(GATEWAY_PORT), "--redis", "redis://redis:6379/0",
        ],
        "ports": [f"{GATEWAY_PORT}:{GATEWAY_PORT}"],
        "volumes": [f"./policy.yaml:{POLICY_IN_CONTAINER}:ro"],
        "depends_on": {"redis": {"condition": "service_healthy"}},
        "restart": "unless-stopped",
    }  # fmt: skip
    services.update(engines)
    doc = {"name": dns_name("switchyard", plan.cluster.name), "services": services, "volumes": {"models": {}}}
    head = (
        f"# {HEADER}\n"
        f"# One host runs the whole plan of cluster {plan.cluster.name}: build the image first with\n"
        f"#   docker build -f deploy/Dockerfile -t {image} .\n"
        f"# then: docker compose up -d   (the gateway listens on :{GATEWAY_PORT})\n"
    )
    url = {rep.name: f"http://{service_name(rep, 0)}:{rep.port}/v1" for rep in plan.replicas}
    return {
        "compose/docker-compose.yaml": head + dump_yaml(doc),
        "compose/policy.yaml": gateway_policy(plan, lambda r: url[r.name]),
    }
