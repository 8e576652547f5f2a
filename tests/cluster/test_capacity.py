from __future__ import annotations

import pytest
from cluster_helpers import make_cluster, make_policy, plan_of

from switchyard.cluster.capacity import CapacityError, capacity, fmt_ratio, pick_large_pool
from switchyard.cluster.topology import load_cluster
from switchyard.policy.loader import load_policy


@pytest.fixture
def spark8(root):
    return plan_of(load_cluster(root / "deploy/clusters/spark8.yaml"), load_policy(root / "policies/spark8.yaml"))


def test_reference_figures(spark8):
    cap = capacity(spark8)
    r = cap.large_rate
    assert cap.large_pool == "large" and cap.small_pools == ("small",)
    # The shipped policy: small replicas at 10r.
    assert spark8.policy.pools["small"].rate == 10 * r
    assert (cap.large_cap, cap.small_cap, cap.baseline_cap) == (3 * r, 20 * r, 4 * r)
    assert cap.baseline_replicas == 4
    assert cap.routed(0.5) == 6 * r and cap.speedup(0.5) == 1.5
    assert cap.routed(0.25) == 12 * r and cap.speedup(0.25) == 3.0
    assert (fmt_ratio(cap.speedup(0.5)), fmt_ratio(cap.speedup(0.25))) == ("1.5x", "3.0x")
    assert cap.bottleneck(0.5) == "large"
    # Few large requests: the small pool becomes the bottleneck.
    assert cap.routed(0.1) == pytest.approx(20 * r / 0.9) and cap.bottleneck(0.1) == "small"
    assert cap.routed(1.0) == cap.large_cap and cap.routed(0.0) == cap.small_cap


def test_figures_scale_with_r_not_fixed_numbers():
    for r in (0.5, 7.0):
        plan = plan_of(
            make_cluster(8),
            make_policy(large={"replicas": 3, "nodes_per_replica": 2, "rate": r}, small={"replicas": 2, "rate": 10 * r}),
        )
        cap = capacity(plan)
        assert cap.speedup(0.5) == pytest.approx(1.5) and cap.speedup(0.25) == pytest.approx(3.0)


def test_large_pool_choice():
    plan = plan_of(
        make_cluster(4),
        make_policy(a={"rate": 1, "model_size_gb": 10}, b={"rate": 1, "model_size_gb": 20}, c={"rate": 1, "nodes_per_replica": 2}),
    )
    assert pick_large_pool(plan) == "c"  # widest replica
    assert pick_large_pool(plan, "a") == "a"
    with pytest.raises(CapacityError, match="no such pool"):
        pick_large_pool(plan, "zzz")
    two = plan_of(make_cluster(2), make_policy(a={"rate": 1, "model_size_gb": 10}, b={"rate": 1, "model_size_gb": 20}))
    assert pick_large_pool(two) == "b"  # same width: bigger model


def test_capacity_needs_rates():
    plan = plan_of(make_cluster(2), make_policy(a={"rate": 1}, b={}))
    with pytest.raises(CapacityError, match=r"pool\(s\) b have no `rate`"):
        capacity(plan)


def test_fmt_ratio():
    assert [fmt_ratio(x) for x in (1.5, 3.0, 8 / 3, 1.0)] == ["1.5x", "3.0x", "2.67x", "1.0x"]
