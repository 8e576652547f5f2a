from __future__ import annotations

import os

import pytest
from cluster_helpers import make_cluster, make_policy, plan_of

from switchyard.cluster.placement import PlanError
from switchyard.cluster.topology import load_cluster
from switchyard.policy.loader import load_policy


def test_reference_layout_plans_3_large_of_2_and_2_small_of_1(root):
    plan = plan_of(load_cluster(root / "deploy/clusters/spark8.yaml"), load_policy(root / "policies/spark8.yaml"))
    layout = {r.name: r.nodes for r in plan.replicas}
    assert layout == {
        "large-0": ("spark-1", "spark-2"),
        "large-1": ("spark-3", "spark-4"),
        "large-2": ("spark-5", "spark-6"),
        "small-0": ("spark-7",),
        "small-1": ("spark-8",),
    }
    # Every node runs exactly one replica; every replica's ranks are 0..tp-1 once each.
    assert sorted(n for r in plan.replicas for n in r.nodes) == sorted(n.name for n in plan.cluster.nodes)
    for r in plan.replicas:
        assert sorted(x for k in range(len(r.nodes)) for x in r.ranks_on(k)) == list(range(r.tp))
    large = plan.pool_replicas("large")[0]
    assert large.tp == 2 and large.url == "http://10.0.0.1:8000/v1"
    assert (large.runtime, large.tensor_parallel, large.pp, large.served_name) == ("vllm", 2, 1, "qwen3-235b-a22b")
    # 118 GB over 2 nodes + 12 GB KV + 8 GB reserve.
    assert plan.usage["spark-1"].used_gb + plan.usage["spark-1"].reserve_gb == pytest.approx(79.0)
    assert plan.warnings == []


def test_ring_refuses_two_groups_of_four_and_says_use_a_switch():
    ring8 = make_cluster(8, "ring")
    with pytest.raises(PlanError) as e:
        plan_of(ring8, make_policy(large={"replicas": 2, "nodes_per_replica": 4, "engine": {"model": "m", "collective": "ring"}}))
    msg = str(e.value)
    assert "replica large-0 spans 4 of the ring's 8 nodes (n1, n2, n3, n4)" in msg
    assert "n4 -> n1, which are not neighbours" in msg
    assert "Use `fabric: switch`" in msg
    # The same shape on a switch plans.
    plan = plan_of(make_cluster(8), make_policy(large={"replicas": 2, "nodes_per_replica": 4}))
    assert [r.nodes for r in plan.replicas] == [("n1", "n2", "n3", "n4"), ("n5", "n6", "n7", "n8")]


def test_ring_accepts_whole_ring_and_neighbour_pairs():
    ring = make_cluster(4, "ring")
    whole = plan_of(ring, make_policy(big={"nodes_per_replica": 4}))
    assert whole.replicas[0].nodes == ("n1", "n2", "n3", "n4") and whole.replicas[0].collective == "ring"
    pairs = plan_of(ring, make_policy(large={"replicas": 1, "nodes_per_replica": 2}, small={"replicas": 2}))
    assert [r.nodes for r in pairs.replicas] == [("n1", "n2"), ("n3",), ("n4",)]
    assert any("auto -> ring" in n for n in pairs.notes)
    # Neighbours by the ring's own order, not the listing order.
    ordered = make_cluster(4, "ring", ring=["n1", "n3", "n2", "n4"])
    plan = plan_of(ordered, make_policy(large={"replicas": 2, "nodes_per_replica": 2}))
    assert [r.nodes for r in plan.replicas] == [("n1", "n3"), ("n2", "n4")]


def test_ring_refuses_three_of_four():
    with pytest.raises(PlanError, match=r"spans 3 of the ring's 4 nodes .* n3 -> n1"):
        plan_of(make_cluster(4, "ring"), make_policy(large={"nodes_per_replica": 3}))


def test_oneshot_needs_a_switch():
    pool = {"nodes_per_replica": 2, "engine": {"model": "m", "collective": "oneshot"}}
    with pytest.raises(PlanError) as e:
        plan_of(make_cluster(4, "ring"), make_policy(large=pool))
    msg = str(e.value)
    assert "collective `oneshot` needs every node of a replica to reach every other directly" in msg
    assert "Use `collective: ring`" in msg
    plan = plan_of(make_cluster(4), make_policy(large=pool))
    assert plan.replicas[0].collective == "oneshot"
    # Inside one node the fabric does not matter.
    single = plan_of(make_cluster(4, "ring"), make_policy(s={"engine": {"model": "m", "collective": "oneshot", "tp": 1}}))
    assert single.replicas[0].collective == "oneshot"


def test_more_replicas_than_nodes_fails():
    with pytest.raises(PlanError) as e:
        plan_of(make_cluster(8), make_policy(large={"replicas": 4, "nodes_per_replica": 2}, small={"replicas": 1}))
    msg = str(e.value)
    assert "asks for 5 replicas needing 9 nodes (large: 4 x 2, small: 1 x 1)" in msg
    assert "has 8 nodes" in msg
    with pytest.raises(PlanError, match="a replica spans 3 nodes but cluster switch2 has 2"):
        plan_of(make_cluster(2), make_policy(big={"nodes_per_replica": 3}))


def test_memory_overflow_is_refused_with_the_numbers():
    with pytest.raises(PlanError) as e:
        plan_of(make_cluster(8), make_policy(large={"replicas": 3, "nodes_per_replica": 2, "model_size_gb": 240, "kv_cache_gb": 16}))
    msg = str(e.value)
    assert "node n1 runs out of memory: needs 136.0 GB" in msg
    assert "120.0 GB weights (240.0 GB / 2 nodes) + 16.0 GB KV cache" in msg
    assert "nodes_per_replica" in msg
    # Spread over 4 nodes it fits.
    plan = plan_of(make_cluster(8), make_policy(large={"replicas": 2, "nodes_per_replica": 4, "model_size_gb": 240, "kv_cache_gb": 16}))
    assert plan.usage["n1"].used_gb == pytest.approx(76.0)


def test_model_size_from_the_model_file(tmp_path):
    weights = tmp_path / "big.gguf"
    with open(weights, "wb") as fh:  # sparse: a 150 GB size without 150 GB of disk
        fh.truncate(150 * 10**9)
    assert os.path.getsize(weights) == 150 * 10**9
    with pytest.raises(PlanError, match=r"node n1 runs out of memory: needs 150.0 GB"):
        plan_of(make_cluster(2), make_policy(big={"model_file": "big.gguf"}), base=tmp_path)
    ok = plan_of(make_cluster(2), make_policy(big={"model_file": "big.gguf", "nodes_per_replica": 2}), base=tmp_path)
    assert ok.sized["big"] == pytest.approx(150.0) and ok.usage["n2"].used_gb == pytest.approx(75.0)


def test_unknown_size_and_idle_nodes_are_warnings():
    plan = plan_of(make_cluster(3), make_policy(m={}))
    assert any("model size unknown" in w for w in plan.warnings)
    assert any("idle nodes: n2, n3" in w for w in plan.warnings)


def test_engine_tp_must_match_the_shape():
    with pytest.raises(PlanError, match=r"engine.tp is 4 but nodes_per_replica 2 x ranks_per_node 1 = 2"):
        plan_of(make_cluster(4), make_policy(m={"nodes_per_replica": 2, "engine": {"model": "m", "tp": 4}}))
    # engine.tp alone: that many ranks on one node.
    plan = plan_of(make_cluster(1, gpus=4), make_policy(m={"engine": {"model": "m", "tp": 4, "device": "cuda"}}))
    assert plan.replicas[0].ranks_per_node == 4 and plan.replicas[0].tp == 4


def test_ranks_per_node_needs_the_gpus():
    with pytest.raises(PlanError, match=r"ranks_per_node 2 but node n1 has 1 GPU"):
        plan_of(make_cluster(2), make_policy(m={"ranks_per_node": 2, "engine": {"model": "m", "device": "cuda"}}))


def test_all_problems_are_reported_at_once():
    with pytest.raises(PlanError) as e:
        plan_of(
            make_cluster(4, "ring"),
            make_policy(a={"nodes_per_replica": 3, "model_size_gb": 900, "engine": {"model": "m", "collective": "oneshot"}}),
        )
    assert len(e.value.issues) == 5  # oneshot, ring shape, memory on each of the 3 nodes
