"""Bare-metal launch files: one bash script per node (torchrun per replica) and the gateway's."""

from __future__ import annotations

import shlex

from switchyard.cluster.emit_common import GATEWAY_PORT, HEADER, shell_cmd
from switchyard.cluster.launch import node_command
from switchyard.cluster.placement import Plan


def node_script(plan: Plan, node: str) -> str:
    c = plan.cluster
    n = c.node(node)
    lines = [
        "#!/usr/bin/env bash",
        f"# {HEADER}",
        f"# Node {node} ({n.address}) of cluster {c.name}, {c.fabric} fabric. Run this on that node.",
        "set -euo pipefail",
    ]
    if n.nics:
        # The collectives' traffic goes over the NICs the cluster file names.
        nics = ",".join(n.nics)
        lines += [f"export NCCL_SOCKET_IFNAME={shlex.quote(nics)}", f"export GLOO_SOCKET_IFNAME={shlex.quote(nics)}"]
    jobs = plan.on_node(node)
    if not jobs:
        lines.append("echo 'this node runs no replica in this plan' >&2")
        return "\n".join(lines) + "\n"
    if len(jobs) > 1:
        lines.append("trap 'kill 0' INT TERM")
    for rep, k in jobs:
        ranks = rep.ranks_on(k)
        role = f"leader, serves {rep.url}" if k == 0 else f"worker, rendezvous at {rep.leader}:{rep.master_port}"
        lines.append(
            f"# replica {rep.name}: node rank {k} of {len(rep.nodes)}, ranks {ranks.start}..{ranks.stop - 1} "
            f"of tp {rep.tp} ({role})"
        )
        cmd = shell_cmd(node_command(rep, k))
        lines.append(("exec " + cmd) if len(jobs) == 1 else (cmd + " &"))
    if len(jobs) > 1:
        lines.append("wait")
    return "\n".join(lines) + "\n"


def gateway_script(plan: Plan) -> str:
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# {HEADER}",
        "# The gateway, on any host that reaches the leaders. REDIS_URL (optional) shares state between gateways.",
        "set -euo pipefail",
        'here="$(cd "$(dirname "$0")" && pwd)"',
        f'exec python -m switchyard.cli serve --policy "$here/../policy.yaml" --host 0.0.0.0 '
        f'--port "${{PORT:-{GATEWAY_PORT}}}" ${{REDIS_URL:+--redis "$REDIS_URL"}}',
    ]) + "\n"  # fmt: skip


def torchrun_files(plan: Plan) -> dict[str, str]:
    files = {f"torchrun/node-{node.name}.sh": node_script(plan, node.name) for node in plan.cluster.order}
    files["torchrun/gateway.sh"] = gateway_script(plan)
    return files
