from __future__ import annotations

import pytest
from cluster_helpers import plan_of

from switchyard.cluster.capacity import capacity
from switchyard.cluster.simulate import PoolLoad, pool_loads, simulate
from switchyard.cluster.topology import load_cluster
from switchyard.policy.loader import load_policy


@pytest.fixture(scope="module")
def spark8():
    from cluster_helpers import ROOT

    plan = plan_of(load_cluster(ROOT / "deploy/clusters/spark8.yaml"), load_policy(ROOT / "policies/spark8.yaml"))
    return plan, capacity(plan)


@pytest.mark.parametrize("f", [0.5, 0.25, 0.1])
def test_saturation_matches_closed_form_within_5_percent(spark8, f):
    plan, cap = spark8
    closed = cap.routed(f)
    res = simulate(pool_loads(plan, cap, f), load=1.3 * closed, requests=60_000, seed=7)
    assert res.sustained == pytest.approx(closed, rel=0.05)
    # The bottleneck pool is busy all the time; its throughput is its capacity.
    neck = next(p for p in res.pools if (p.name == cap.large_pool) == (cap.bottleneck(f) == "large"))
    assert neck.utilization > 0.95
    assert neck.throughput == pytest.approx(neck.capacity, rel=0.05)


def test_below_saturation_everything_offered_is_served(spark8):
    plan, cap = spark8
    closed = cap.routed(0.5)
    light = simulate(pool_loads(plan, cap, 0.5), load=0.5 * closed, requests=40_000, seed=1)
    busy = simulate(pool_loads(plan, cap, 0.5), load=0.9 * closed, requests=40_000, seed=1)
    assert light.throughput == pytest.approx(0.5 * closed, rel=0.05)
    assert busy.throughput == pytest.approx(0.9 * closed, rel=0.05)
    # Queueing: p99 grows as the large pool fills up.
    assert busy.p99 > light.p99 > 0


def test_mm1_mean_latency_matches_queueing_theory():
    # One server at rate 10, load 5: M/M/1 sojourn time is exponential with mean 1/(mu - lambda).
    res = simulate([PoolLoad("a", 1, 10.0, 1.0)], load=5.0, requests=80_000, seed=3)
    assert res.p50 == pytest.approx(0.2 * 0.6931, rel=0.06)
    assert res.p99 == pytest.approx(0.2 * 4.605, rel=0.08)


def test_seeded_and_validated():
    pools = [PoolLoad("a", 2, 1.0, 1.0)]
    assert simulate(pools, 1.0, 5_000, seed=4) == simulate(pools, 1.0, 5_000, seed=4)
    with pytest.raises(ValueError, match="load"):
        simulate(pools, 0.0, 1_000)
