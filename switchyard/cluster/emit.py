"""`--emit DIR`: write the bare-metal scripts, compose and Kubernetes files, and a README."""

from __future__ import annotations

import shutil
from pathlib import Path

from switchyard.cluster.emit_common import GATEWAY_PORT, HEADER, gateway_policy
from switchyard.cluster.emit_compose import compose_files
from switchyard.cluster.emit_k8s import k8s_files
from switchyard.cluster.emit_torchrun import torchrun_files
from switchyard.cluster.placement import Plan

MARKER = ".switchyard-plan"
_OWNED = ("torchrun", "compose", "k8s", "policy.yaml", "README.md", MARKER)


class EmitError(Exception):
    pass


def render(plan: Plan, summary: str, image: str, command: str) -> dict[str, str]:
    """Every emitted file, path relative to the output folder -> text."""
    files: dict[str, str] = {"policy.yaml": gateway_policy(plan, lambda r: r.url)}
    files.update(torchrun_files(plan))
    files.update(compose_files(plan, image))
    files.update(k8s_files(plan, image))
    files["README.md"] = _readme(plan, summary, command, image)
    return files


def _readme(plan: Plan, summary: str, command: str, image: str) -> str:
    nodes = " ".join(f"node-{n.name}.sh" for n in plan.cluster.order)
    return f"""# Launch files for cluster `{plan.cluster.name}`, policy `{plan.policy.name}`

{HEADER}
Regenerate with:

    {command}

## The plan

```
{summary}
```

## Bare metal (torchrun)

On each node run its script from `torchrun/` ({nodes}); each starts
`switchyard engine serve` for the replica ranks placed there, with rendezvous on the
replica's first node (its leader, which serves HTTP). Then start the gateway anywhere that
reaches the leaders: `torchrun/gateway.sh` (serves `policy.yaml` on :{GATEWAY_PORT}; set
REDIS_URL to share state between several gateways).

## docker compose (one host)

    docker build -f deploy/Dockerfile -t {image} .
    cd compose && docker compose up -d

## Kubernetes (LeaderWorkerSet)

    bash k8s/label-nodes.sh
    kubectl apply -f k8s/switchyard.yaml
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
