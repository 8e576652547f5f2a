"""Bare-metal launch files: one bash script per node (its replicas' exact commands) and the gateway's."""

from __future__ import annotations

import shlex

from switchyard.cluster.emit_common import GATEWAY_PORT, HEADER, dns_name, shell_cmd
from switchyard.cluster.launch import Site, node_launch
from switchyard.cluster.placement import Plan, Replica


def _role(rep: Replica, k: int) -> str:
    if k == 0:
        return f"leader, serves {rep.url}"
    if rep.runtime == "vllm":
        return f"worker, joins the Ray head at {rep.leader}:{rep.master_port}"
    return f"worker, rendezvous at {rep.leader}:{rep.master_port}"


def _what(rep: Replica) -> str:
    if rep.runtime == "vllm":
        return f"vLLM, tensor parallel {rep.tensor_parallel} x pipeline parallel {rep.pp}"
    if rep.runtime == "sglang":
        return f"SGLang, tp {rep.tp}"
    if rep.runtime == "llama.cpp":
        return "llama.cpp's llama-server"
    return f"our engine, tp {rep.tp}, collective {rep.collective}"


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
    calls = []
    for rep, k in jobs:
        ranks = rep.ranks_on(k)
        fn = dns_name(rep.name).replace("-", "_")
        launch = node_launch(rep, Site(rep.leader, str(k), node_address=rep.addresses[k]))
        lines += [
            "",
            f"# replica {rep.name} ({_what(rep)}): node rank {k} of {len(rep.nodes)}, ranks "
            f"{ranks.start}..{ranks.stop - 1} ({_role(rep, k)})",
            f"{fn}() {{",
            *(f"  export {key}={shlex.quote(value)}" for key, value in launch.env.items()),
            *(f"  {line}" for line in launch.script(lambda argv: shell_cmd(argv, "    "))),
            "}",
        ]
        calls.append(fn)
    lines.append("")
    if len(calls) == 1:
        lines.append(calls[0])
    else:
        lines += ["trap 'kill 0' INT TERM", *(f"{fn} &" for fn in calls), "wait"]
    return "\n".join(lines) + "\n"


def gateway_script(plan: Plan) -> str:
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# {HEADER}",
        "# The gateway, on any host that reaches the leaders. It listens on every address, so it",
        "# runs with API keys (`switchyard keys create`) and the admin key from SWITCHYARD_ADMIN_KEY.",
        "# REDIS_URL (optional) shares state and keys between several gateways.",
        "set -euo pipefail",
        ': "${SWITCHYARD_ADMIN_KEY:?export SWITCHYARD_ADMIN_KEY first (e.g. openssl rand -hex 24)}"',
        'here="$(cd "$(dirname "$0")" && pwd)"',
        f'exec python -m switchyard.cli serve --policy "$here/../policy.yaml" --host 0.0.0.0 '
        f'--port "${{PORT:-{GATEWAY_PORT}}}" --auth ${{REDIS_URL:+--redis "$REDIS_URL"}}',
    ]) + "\n"  # fmt: skip


def node_files(plan: Plan) -> dict[str, str]:
    files = {f"nodes/node-{node.name}.sh": node_script(plan, node.name) for node in plan.cluster.order}
    files["nodes/gateway.sh"] = gateway_script(plan)
    return files
