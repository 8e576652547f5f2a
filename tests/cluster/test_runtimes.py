"""Placement under each runtime: the shared rules hold for all, each runtime adds its own."""

from __future__ import annotations

import pytest
from cluster_helpers import make_cluster, make_policy, plan_of

from switchyard.cluster.local import local_launches
from switchyard.cluster.placement import PlanError
from switchyard.cluster.report import placement_text
from switchyard.engine.serving import registry
from switchyard.policy.loader import PolicyError, parse_policy


def _vllm(**engine) -> dict:
    return {"runtime": "vllm", "model": "org/m", **engine}


def test_vllm_runs_tp_within_a_node_and_pp_across_nodes_unless_tp_says_otherwise():
    gpus4 = make_cluster(4, gpus=4, device="cuda")
    default = plan_of(gpus4, make_policy(m={"nodes_per_replica": 2, "ranks_per_node": 4, "engine": _vllm()}))
    rep = default.replicas[0]
    assert (rep.tp, rep.tensor_parallel, rep.pp) == (8, 4, 2)
    across = plan_of(gpus4, make_policy(m={"nodes_per_replica": 2, "ranks_per_node": 4, "engine": _vllm(tp=8)}))
    assert (across.replicas[0].tensor_parallel, across.replicas[0].pp) == (8, 1)
    assert "vllm (tp 8 x pp 1)" in placement_text(across)
    alone = plan_of(gpus4, make_policy(m={"engine": _vllm(tp=4)}))  # tp alone: that many GPUs on one node
    assert (alone.replicas[0].ranks_per_node, alone.replicas[0].tensor_parallel) == (4, 4)
    with pytest.raises(PlanError, match=r"engine.tp 3 must divide the replica's 8 ranks"):
        plan_of(gpus4, make_policy(m={"nodes_per_replica": 2, "ranks_per_node": 4, "engine": _vllm(tp=3)}))


def test_sglang_tp_spans_every_rank_of_the_replica():
    plan = plan_of(make_cluster(2, device="cuda"),
                   make_policy(m={"nodes_per_replica": 2, "engine": {"runtime": "sglang", "model": "org/m"}}))
    assert plan.replicas[0].tp == 2 and plan.replicas[0].runtime == "sglang"
    with pytest.raises(PlanError, match=r"engine.tp is 4 but nodes_per_replica 2 x ranks_per_node 1 = 2"):
        plan_of(make_cluster(2, device="cuda"),
                make_policy(m={"nodes_per_replica": 2, "engine": {"runtime": "sglang", "model": "org/m", "tp": 4}}))


def test_fabric_and_memory_rules_hold_for_every_runtime():
    ring = make_cluster(4, "ring", device="cuda")
    for runtime in ("vllm", "sglang"):
        with pytest.raises(PlanError, match=r"spans 3 of the ring's 4 nodes"):
            plan_of(ring, make_policy(m={"nodes_per_replica": 3, "engine": {"runtime": runtime, "model": "org/m"}}))
        with pytest.raises(PlanError, match=r"node n1 runs out of memory"):
            plan_of(ring, make_policy(m={"model_size_gb": 300, "engine": {"runtime": runtime, "model": "org/m"}}))
    with pytest.raises(PlanError, match=r"ranks_per_node 2 but node n1 has 1 GPU"):
        plan_of(ring, make_policy(m={"ranks_per_node": 2, "engine": _vllm()}))


def test_the_one_shot_rule_is_our_engines_only():
    ring = make_cluster(4, "ring", device="cuda")
    plan = plan_of(ring, make_policy(m={"nodes_per_replica": 2, "engine": {"runtime": "sglang", "model": "org/m"}}))
    assert plan.notes == []  # no "auto -> ring" note: SGLang picks its own all-reduce
    with pytest.raises(PlanError, match=r"engine.collective is our engine's option; vllm chooses its own"):
        plan_of(ring, make_policy(m={"engine": _vllm(collective="oneshot")}))


def test_llama_cpp_is_one_process_on_one_cpu_node():
    cpu = make_cluster(2, device="cpu")
    plan = plan_of(cpu, make_policy(m={"engine": {"runtime": "llama.cpp", "model": "m.gguf"}}))
    assert plan.replicas[0].runtime == "llama.cpp" and plan.replicas[0].tp == 1
    with pytest.raises(PlanError, match=r"llama.cpp serves a replica from one process on one node"):
        plan_of(cpu, make_policy(m={"nodes_per_replica": 2, "engine": {"runtime": "llama.cpp", "model": "m.gguf"}}))
    with pytest.raises(PlanError, match=r"runtime llama.cpp does not run on cuda here"):
        plan_of(make_cluster(1), make_policy(m={"engine": {"runtime": "llama.cpp", "model": "m.gguf"}}))
    with pytest.raises(PlanError, match=r"runtime vllm does not run on cpu here; use llama.cpp or our engine"):
        plan_of(cpu, make_policy(m={"engine": _vllm()}))


def test_an_unknown_runtime_is_a_policy_error_with_its_line():
    with pytest.raises(PolicyError) as e:
        parse_policy("pools:\n  m:\n    model: m\n    replicas: 1\n    engine: {runtime: tgi, model: m}\n"
                     "routes:\n  - {name: d, pool: m}\n", "p.yaml")
    assert "p.yaml:5:" in str(e.value) and "runtime" in str(e.value)


def test_our_engines_tp_is_checked_against_the_models_heads():
    """SmolLM2-135M has 9 heads and 3 KV heads: TP 3 splits them, TP 2 does not."""
    try:
        registry.resolve("smollm2-135m", pull_missing=False)
    except registry.ModelNotFound:
        pytest.skip("SmolLM2 not pulled: `switchyard models pull smollm2-135m`")
    two = make_cluster(2, device="cpu")
    with pytest.raises(PlanError, match=r"TP=2 does not fit this model: 9 attention heads and 3 KV heads.*"
                                        r"Supported TP widths: 1, 3"):
        plan_of(two, make_policy(m={"nodes_per_replica": 2, "engine": {"model": "smollm2-135m"}}))
    ok = plan_of(make_cluster(1, device="cpu"), make_policy(m={"engine": {"model": "smollm2-135m", "tp": 3}}))
    assert ok.replicas[0].tp == 3 and not any("not checked" in n for n in ok.notes)
    # Another runtime's TP is its own business: no head check, no note.
    vllm = plan_of(make_cluster(2, device="cuda"), make_policy(m={"nodes_per_replica": 2, "engine": _vllm()}))
    assert vllm.notes == []
    unknown = plan_of(two, make_policy(m={"nodes_per_replica": 2, "engine": {"model": "not-here"}}))
    assert any("model not-here is not on this machine, so TP 2 is not checked" in n for n in unknown.notes)


def test_switchyard_up_starts_our_engine_only():
    policy = parse_policy(
        "pools:\n"
        "  ours: {model: a, replicas: [{url: 'http://127.0.0.1:8101/v1'}], engine: {model: smollm2-135m}}\n"
        "  cpp: {model: b, replicas: [{url: 'http://127.0.0.1:8102/v1'}],\n"
        "        engine: {runtime: llama.cpp, model: /m.gguf}}\n"
        "routes:\n  - {name: d, pool: ours}\n")
    launches = {x.pool: x for x in local_launches(policy, python="/py")}
    assert launches["ours"].command[:2] == ["/py", "-m"] and launches["cpp"].command is None
