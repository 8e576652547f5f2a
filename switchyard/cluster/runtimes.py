"""The inference servers a pool may run on, and the rules each puts on a replica's shape.

- `switchyard`: our engine; torchrun across nodes, TP over every rank of the replica (its
  head count is checked in `model_check`), the collective chosen by the fabric rules.
- `vllm`: `vllm serve`; across nodes over Ray, tensor parallel x pipeline parallel = the
  replica's ranks (by default TP within a node and PP across nodes, as vLLM advises).
- `sglang`: `python3 -m sglang.launch_server`; `--tp` = the replica's ranks, across nodes with
  `--nnodes`, `--node-rank` and `--dist-init-addr`.
- `llama.cpp`: `llama-server` on one CPU node.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.policy.schema import EngineLaunch


@dataclass(frozen=True)
class Runtime:
    name: str
    image: str  # the runtime's official image ("" = ours, from `plan --image`)
    cache: str  # where it keeps downloaded models inside its container
    devices: tuple[str, ...]
    multi_node: bool
    hub: bool  # downloads weights from the Hugging Face hub (so it gets HF_TOKEN)
    keeps_entrypoint: bool = False  # its image's entrypoint is the server: containers pass arguments only


RUNTIMES: dict[str, Runtime] = {
    "switchyard": Runtime("switchyard", "", "/root/.cache/switchyard", ("cpu", "cuda"), True, False),
    "vllm": Runtime("vllm", "vllm/vllm-openai:latest", "/root/.cache/huggingface", ("cuda",), True, True),
    "sglang": Runtime("sglang", "lmsysorg/sglang:latest", "/root/.cache/huggingface", ("cuda",), True, True),
    "llama.cpp": Runtime("llama.cpp", "ghcr.io/ggml-org/llama.cpp:server", "/root/.cache/llama.cpp", ("cpu",),
                         False, True, keeps_entrypoint=True),
}  # fmt: skip


@dataclass(frozen=True)
class Parallel:
    """How a replica's ranks are used: ranks_per_node x nodes = tp x pp."""

    ranks_per_node: int
    tp: int
    pp: int = 1


def parallelism(pool: str, eng: EngineLaunch | None, nodes: int, ranks_per_node: int, device: str,
                errors: list[str]) -> Parallel:
    """The replica's parallel layout under its runtime; appends to `errors` what the runtime refuses."""
    runtime = eng.runtime if eng is not None else "switchyard"
    spec = RUNTIMES[runtime]
    explicit = eng.model_fields_set if eng is not None else set()
    rpn = ranks_per_node
    if "tp" in explicit and nodes == 1 and rpn == 1 and runtime != "llama.cpp":
        rpn = eng.tp  # engine.tp alone means: that many ranks on one node
    ranks = nodes * rpn
    if device not in spec.devices:
        other = "llama.cpp or our engine" if device == "cpu" else "vllm, sglang or our engine"
        errors.append(f"pool {pool}: runtime {runtime} does not run on {device} here; use {other} for a "
                      f"{device} pool (set engine.device or the cluster's device)")
    if runtime != "switchyard" and "collective" in explicit:
        errors.append(f"pool {pool}: engine.collective is our engine's option; {runtime} chooses its own "
                      f"all-reduce: drop it, or use runtime: switchyard")
    if runtime == "llama.cpp":
        if nodes > 1 or rpn > 1 or ("tp" in explicit and eng.tp > 1):
            errors.append(f"pool {pool}: llama.cpp serves a replica from one process on one node: set "
                          f"nodes_per_replica and ranks_per_node to 1 and drop engine.tp, or use vllm or "
                          f"sglang to span GPUs and nodes")
        return Parallel(1, 1)
    if runtime == "vllm":
        if "tp" not in explicit:
            return Parallel(rpn, rpn, nodes)  # TP within a node, PP across nodes
        if ranks % eng.tp:
            errors.append(f"pool {pool}: engine.tp {eng.tp} must divide the replica's {ranks} ranks "
                          f"(nodes_per_replica {nodes} x ranks_per_node {rpn}): vLLM runs tensor parallel "
                          f"tp x pipeline parallel ranks / tp")
            return Parallel(rpn, ranks)
        return Parallel(rpn, eng.tp, ranks // eng.tp)
    if "tp" in explicit and eng.tp != ranks:
        errors.append(
            f"pool {pool}: engine.tp is {eng.tp} but nodes_per_replica {nodes} x ranks_per_node {rpn} "
            f"= {ranks} ranks; make them agree (or drop engine.tp: it follows from the other two)"
        )
    return Parallel(rpn, ranks)
