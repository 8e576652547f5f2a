"""`--emit DIR`: write the bare-metal node scripts, compose and Kubernetes files, and a README."""

from __future__ import annotations

import shutil
from pathlib import Path

from switchyard.cluster.emit_common import GATEWAY_PORT, HEADER, gateway_policy
from switchyard.cluster.emit_compose import compose_files
from switchyard.cluster.emit_k8s import k8s_files
from switchyard.cluster.emit_nodes import node_files
from switchyard.cluster.placement import Plan

MARKER = ".switchyard-plan"
# "torchrun" is where node scripts went before other runtimes than ours could be planned.
_OWNED = ("nodes", "torchrun", "compose", "k8s", "policy.yaml", "README.md", MARKER)


class EmitError(Exception):
    pass


def render(plan: Plan, summary: str, image: str, command: str) -> dict[str, str]:
    """Every emitted file, path relative to the output folder -> text."""
    files: dict[str, str] = {"policy.yaml": gateway_policy(plan, lambda r: r.url)}
    files.update(node_files(plan))
    files.update(compose_files(plan, image))
    files.update(k8s_files(plan, image))
    files["README.md"] = _readme(plan, summary, command, image)
    return files


def _runtimes(plan: Plan) -> str:
    seen = sorted({r.runtime for r in plan.replicas})
    return ", ".join(seen)


def _readme(plan: Plan, summary: str, command: str, image: str) -> str:
    nodes = " ".join(f"node-{n.name}.sh" for n in plan.cluster.order)
    return f"""# Launch files for cluster `{plan.cluster.name}`, policy `{plan.policy.name}`

{HEADER}
Regenerate with:

    {command}

Runtimes in this plan: {_runtimes(plan)}. The gateway always serves `policy.yaml` with API keys on
and its admin key from a secret (SWITCHYARD_ADMIN_KEY), because it listens on every address.
Create API keys with `switchyard keys create --name NAME --redis URL` against the gateway's Redis.

## The plan

```
{summary}
```

## Bare metal (node scripts)

On each node run its script from `nodes/` ({nodes}); each starts the replica parts placed
there with their exact commands (our engine under torchrun, `vllm serve` with a Ray cluster
across nodes, `python3 -m sglang.launch_server` with its node rank, `llama-server`), with the
leader of each replica serving HTTP. Then start the gateway anywhere that reaches the leaders:
`SWITCHYARD_ADMIN_KEY=... nodes/gateway.sh` (serves `policy.yaml` on :{GATEWAY_PORT} with `--auth`; set
REDIS_URL to share state and keys between several gateways).

## docker compose (one host)

    docker build -f deploy/Dockerfile -t {image} .
    cd compose && bash secrets.sh && docker compose up -d
    docker compose exec gateway python -m switchyard.cli keys create --name me --redis redis://redis:6379/0

`secrets.sh` writes `gateway.env` (the admin key) and, with HF_TOKEN exported, `hf.env`.

## Kubernetes (Deployments, LeaderWorkerSet for multi-node replicas)

    HF_TOKEN=... bash k8s/secrets.sh     # Secrets switchyard-admin and switchyard-hf-token
    bash k8s/label-nodes.sh
    kubectl apply -f k8s/switchyard.yaml
    kubectl exec deploy/switchyard-gateway -- python -m switchyard.cli keys create --name me \\
        --redis redis://switchyard-redis:6379/0
"""


def write(out: Path, files: dict[str, str]) -> list[Path]:
    """Replace what a previous `--emit` wrote in `out`; refuse a non-empty folder we did not write."""
    if out.exists():
        if not out.is_dir():
            raise EmitError(f"--emit {out}: exists and is not a folder")
        if any(out.iterdir()) and not (out / MARKER).exists():
            raise EmitError(
                f"--emit {out}: folder is not empty and was not written by `switchyard plan`; "
                f"give an empty or new folder"
            )
        for name in _OWNED:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    written = []
    for rel, text in sorted({**files, MARKER: f"{HEADER}\n"}.items()):
        p = out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        if p.suffix == ".sh":
            p.chmod(0o755)
        written.append(p)
    return written
