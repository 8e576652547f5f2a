from __future__ import annotations

import json
import shlex
from collections import Counter
from pathlib import Path

import pytest
import yaml
from cluster_helpers import ROOT, make_cluster, make_policy, plan_of

from switchyard.cluster.emit import EmitError, render, write
from switchyard.cluster.placement import Plan
from switchyard.cluster.topology import load_cluster
from switchyard.policy.loader import load_policy, parse_policy


def _plans() -> dict[str, Plan]:
    return {
        "spark8": plan_of(load_cluster(ROOT / "deploy/clusters/spark8.yaml"), load_policy(ROOT / "policies/spark8.yaml")),
        "ring4": plan_of(load_cluster(ROOT / "deploy/clusters/ring4.yaml"), load_policy(ROOT / "policies/ring4.yaml")),
        # Two ranks per node, a replica over 2 nodes, and a single-node TP replica.
        "multi": plan_of(
            make_cluster(4, gpus=2),
            make_policy(
                big={"nodes_per_replica": 2, "ranks_per_node": 2, "engine": {"model": "b", "device": "cuda"}},
                mid={"replicas": 2, "engine": {"model": "m", "tp": 2, "device": "cuda"}},
            ),
        ),
    }


PLANS = _plans()


def _expected(plan: Plan) -> Counter:
    """(replica, global rank) for every rank the plan has: each must appear exactly once."""
    return Counter((r.name, rank) for r in plan.replicas for rank in range(r.tp))


def _flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def _ranks_of(argv: list[str], rep_tp: int) -> range:
    nproc = int(_flag(argv, "--nproc-per-node", "1"))
    node_rank = int(_flag(argv, "--node-rank", "0"))
    return range(node_rank * nproc, (node_rank + 1) * nproc) if rep_tp > 1 else range(1)


@pytest.fixture(params=sorted(PLANS))
def case(request):
    plan = PLANS[request.param]
    return plan, render(plan, "summary", "img:1", "switchyard plan ...")


def test_every_yaml_parses_and_policies_load(case):
    plan, files = case
    for rel, text in files.items():
        if rel.endswith(".yaml"):
            docs = list(yaml.safe_load_all(text))
            assert docs and all(isinstance(d, dict) for d in docs), rel
    for rel in ("policy.yaml", "compose/policy.yaml"):
        spec = parse_policy(files[rel], rel)
        assert set(spec.pools) == set(plan.policy.pools) and spec.name == plan.policy.name
        assert [r.name for p in spec.pools.values() for r in p.replicas] == [r.name for r in plan.replicas]
    bare = parse_policy(files["policy.yaml"])
    assert {r.name: r.url for p in bare.pools.values() for r in p.replicas} == {r.name: r.url for r in plan.replicas}


def test_torchrun_scripts_run_every_rank_once(case):
    plan, files = case
    seen: Counter = Counter()
    by_leader = {(r.leader, r.master_port): r for r in plan.replicas}
    scripts = [rel for rel in files if rel.startswith("torchrun/node-")]
    assert sorted(scripts) == sorted(f"torchrun/node-{n.name}.sh" for n in plan.cluster.nodes)
    for rel in scripts:
        node = plan.cluster.node(rel.removeprefix("torchrun/node-").removesuffix(".sh"))
        text = files[rel].replace("\\\n", " ")
        for line in text.splitlines():
            argv = shlex.split(line)
            if not argv:
                continue
            argv = [a for a in argv if a not in ("exec", "&")]
            if "engine" not in argv:
                continue
            port = int(_flag(argv, "--port"))
            if argv[0] == "torchrun" and "--master-addr" in argv:
                rep = by_leader[(_flag(argv, "--master-addr"), int(_flag(argv, "--master-port")))]
                assert rep.nodes[int(_flag(argv, "--node-rank"))] == node.name
            else:  # one node: this node leads the replica
                rep = next(r for r in plan.replicas if r.nodes == (node.name,) and r.port == port)
            assert int(_flag(argv, "--tp")) == rep.tp and _flag(argv, "--collective") == rep.collective
            for rank in _ranks_of(argv, rep.tp):
                seen[(rep.name, rank)] += 1
    assert seen == _expected(plan)


def test_compose_services_match_the_plan(case):
    plan, files = case
    doc = yaml.safe_load(files["compose/docker-compose.yaml"])
    services = doc["services"]
    engines = {name: s for name, s in services.items() if "switchyard.replica" in s.get("labels", {})}
    assert set(services) == set(engines) | {"gateway", "redis"}
    seen: Counter = Counter()
    placed = {}
    for name, s in engines.items():
        assert s["hostname"] == name
        rep = next(r for r in plan.replicas if r.name == s["labels"]["switchyard.replica"])
        k = int(s["labels"]["switchyard.node-rank"])
        placed[(rep.name, k)] = s["labels"]["switchyard.planned-node"]
        argv = s["command"]
        assert int(_flag(argv, "--tp")) == rep.tp and _flag(argv, "--model") == rep.model
        if len(rep.nodes) > 1:
            assert _flag(argv, "--master-addr") == f"{rep.pool}-{rep.index}-n0" and _flag(argv, "--node-rank") == str(k)
        ranks = [int(x) for x in s["labels"]["switchyard.ranks"].split(",")]
        assert ranks == list(rep.ranks_on(k))
        for rank in ranks:
            seen[(rep.name, rank)] += 1
        if rep.device == "cuda":
            assert s["deploy"]["resources"]["reservations"]["devices"][0]["count"] == rep.ranks_per_node
    assert seen == _expected(plan)
    assert placed == {(r.name, k): n for r in plan.replicas for k, n in enumerate(r.nodes)}
    policy = parse_policy(files["compose/policy.yaml"])
    urls = [r.url for p in policy.pools.values() for r in p.replicas]
    assert urls == [f"http://{r.pool}-{r.index}-n0:{r.port}/v1" for r in plan.replicas]
    assert all(u.split("//")[1].split(":")[0] in services for u in urls)
    assert "--policy" in services["gateway"]["command"] and "redis://redis:6379/0" in services["gateway"]["command"]


def test_k8s_manifests_name_every_replica_and_rank_once(case):
    plan, files = case
    docs = list(yaml.safe_load_all(files["k8s/switchyard.yaml"]))
    kinds = Counter(d["kind"] for d in docs)
    assert kinds["LeaderWorkerSet"] == len(plan.policy.pools)
    assert kinds["ConfigMap"] == 1 and kinds["Deployment"] == 2
    seen: Counter = Counter()
    for lws in (d for d in docs if d["kind"] == "LeaderWorkerSet"):
        pool = lws["metadata"]["labels"]["switchyard.io/pool"]
        reps = plan.pool_replicas(pool)
        spec = lws["spec"]
        assert spec["replicas"] == len(reps) and spec["leaderWorkerTemplate"]["size"] == len(reps[0].nodes)
        leader = spec["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
        assert leader["containers"][0]["ports"][0]["containerPort"] == reps[0].port
        slots = leader["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
        assert slots == [r.name for r in reps]
        placement = json.loads(lws["metadata"]["annotations"]["switchyard.io/placement"])
        for name, parts in placement.items():
            rep = next(r for r in reps if r.name == name)
            assert [p["node"] for p in parts] == list(rep.nodes)
            for p in parts:
                for rank in p["ranks"]:
                    seen[(name, rank)] += 1
        svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == f"{lws['metadata']['name']}-leaders")
        assert svc["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert seen == _expected(plan)
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    policy = parse_policy(config["data"]["policy.yaml"])
    names = Counter(r.name for p in policy.pools.values() for r in p.replicas)
    assert names == Counter(r.name for r in plan.replicas)
    labels = [line.split()[3:5] for line in files["k8s/label-nodes.sh"].splitlines() if line.startswith("kubectl")]
    assert Counter(tuple(x) for x in labels) == Counter(
        (n, f"switchyard.io/slot={r.name}") for r in plan.replicas for n in r.nodes
    )


def test_ring_scripts_use_the_ring_collective_and_nics():
    files = render(PLANS["ring4"], "s", "img", "cmd")
    a = files["torchrun/node-node-a.sh"]
    assert "--collective ring" in a and "export NCCL_SOCKET_IFNAME=enp1s0f0np0,enp1s0f1np1" in a


def test_write_replaces_its_own_output_and_refuses_foreign_folders(tmp_path: Path):
    files = render(PLANS["spark8"], "s", "img", "cmd")
    out = tmp_path / "out"
    write(out, files)
    (out / "torchrun" / "node-stale.sh").write_text("old")
    write(out, files)
    assert not (out / "torchrun" / "node-stale.sh").exists()
    assert (out / "torchrun" / "node-spark-1.sh").stat().st_mode & 0o111
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(EmitError, match="not written by `switchyard plan`"):
        write(foreign, files)
    assert (foreign / "notes.txt").read_text() == "keep me"
