"""docker compose for one host: Redis, the gateway, and one service per node of each replica.

Each planned node of a replica becomes a container of its runtime's image; ranks rendezvous
(torchrun, SGLang) or join the Ray head (vLLM) at the leader's service name, as they would at
the leader's address on the cluster. The gateway listens on every address of the host, so it
runs with API keys and takes its admin key from `gateway.env`; `secrets.sh` writes that file
(and `hf.env` with HF_TOKEN for gated models) without putting a key on any command line.
"""

from __future__ import annotations

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

POLICY_IN_CONTAINER = "/etc/switchyard/policy.yaml"
GATEWAY_ENV = "gateway.env"
HF_ENV = "hf.env"


def service_name(rep: Replica, node_rank: int) -> str:
    return dns_name(rep.pool, str(rep.index), f"n{node_rank}")


def _healthcheck(rep: Replica) -> dict[str, Any]:
    url = f"http://127.0.0.1:{rep.port}/health"
    if rep.runtime == "llama.cpp":  # its image has curl and no Python
        test = ["CMD", "curl", "-fsS", url]
    else:
        test = ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen('{url}')"]
    return {"test": test, "interval": "10s", "start_period": "600s"}


def _engine_service(rep: Replica, k: int, image: str) -> dict[str, Any]:
    runtime = RUNTIMES[rep.runtime]
    leader = service_name(rep, 0)
    launch = node_launch(rep, Site(leader, str(k), host="0.0.0.0"), python="python3",
                         llama_server="/app/llama-server")
    entrypoint, args = container_exec(launch, runtime.keeps_entrypoint)
    svc: dict[str, Any] = {"image": image_of(rep, image), "hostname": service_name(rep, k)}
    if entrypoint is not None:
        svc["entrypoint"] = entrypoint
    if args:
        svc["command"] = args
    svc["labels"] = {
        "switchyard.replica": rep.name,
        "switchyard.runtime": rep.runtime,
        "switchyard.node-rank": str(k),
        "switchyard.ranks": ",".join(str(r) for r in rep.ranks_on(k)),
        "switchyard.planned-node": rep.nodes[k],
    }
    if runtime.hub:
        svc["env_file"] = [{"path": HF_ENV, "required": False}]
    svc["volumes"] = [f"models:{runtime.cache}"]
    if (folder := model_dir(rep)) is not None:
        svc["volumes"].append(f"{folder}:{folder}:ro")
    svc["shm_size"] = "8gb"  # NCCL's and torch.distributed's shared-memory transports need more than 64 MB
    svc["restart"] = "unless-stopped"
    if rep.device == "cuda":
        svc["deploy"] = {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "count": rep.ranks_per_node, "capabilities": ["gpu"]}]
                }
            }
        }
    if k == 0:
        svc["healthcheck"] = _healthcheck(rep)
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
        "command": gateway_command(POLICY_IN_CONTAINER, "redis://redis:6379/0"),
        "env_file": [GATEWAY_ENV],
        "ports": [f"{GATEWAY_PORT}:{GATEWAY_PORT}"],
        "volumes": [f"./policy.yaml:{POLICY_IN_CONTAINER}:ro"],
        "depends_on": {"redis": {"condition": "service_healthy"}},
        "restart": "unless-stopped",
    }
    services.update(engines)
    doc = {"name": dns_name("switchyard", plan.cluster.name), "services": services, "volumes": {"models": {}}}
    head = (
        f"# {HEADER}\n"
        f"# One host runs the whole plan of cluster {plan.cluster.name}: build our image first with\n"
        f"#   docker build -f deploy/Dockerfile -t {image} .\n"
        f"# then: bash secrets.sh && docker compose up -d   (the gateway listens on :{GATEWAY_PORT})\n"
    )
    url = {rep.name: f"http://{service_name(rep, 0)}:{rep.port}/v1" for rep in plan.replicas}
    files = {
        "compose/docker-compose.yaml": head + dump_yaml(doc),
        "compose/policy.yaml": gateway_policy(plan, lambda r: url[r.name]),
        "compose/secrets.sh": secrets_script("compose"),
    }
    return files
