"""Emitted launch files: every rank launched once with the runtime's exact flags, every file valid
against its schema (Kubernetes, the LeaderWorkerSet CRD, compose), every gateway policy passing
`switchyard policy check`, and the gateway never serving without keys."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from cluster_helpers import ROOT, make_cluster, make_policy, plan_of
from manifests import compose_problems, k8s_problems

from switchyard.cluster.emit import EmitError, render, write
from switchyard.cluster.placement import Plan, Replica
from switchyard.cluster.topology import load_cluster
from switchyard.policy.loader import load_policy, parse_policy


def _plans() -> dict[str, Plan]:
    return {
        "spark8": plan_of(load_cluster(ROOT / "deploy/clusters/spark8.yaml"), load_policy(ROOT / "policies/spark8.yaml")),
        "ring4": plan_of(load_cluster(ROOT / "deploy/clusters/ring4.yaml"), load_policy(ROOT / "policies/ring4.yaml")),
        # Our engine: two ranks per node, a replica over 2 nodes, and a single-node TP replica.
        "multi": plan_of(
            make_cluster(4, gpus=2),
            make_policy(
                big={"nodes_per_replica": 2, "ranks_per_node": 2, "engine": {"model": "b", "device": "cuda"}},
                mid={"replicas": 2, "engine": {"model": "m", "tp": 2, "device": "cuda"}},
            ),
        ),
        # vLLM with TP within a node and PP across nodes, SGLang on one node, llama.cpp on CPU nodes.
        "mixed": plan_of(
            make_cluster(6, gpus=2, device="cuda"),
            make_policy(
                large={"nodes_per_replica": 2, "ranks_per_node": 2, "engine": {"runtime": "vllm", "model": "org/big"}},
                mid={"engine": {"runtime": "sglang", "model": "org/mid", "tp": 2}},
                cpu={"replicas": 2, "engine": {"runtime": "llama.cpp", "model": "/models/small.gguf", "device": "cpu",
                                               "args": ["--threads", "8"]}},
            ),
        ),
    }  # fmt: skip


PLANS = _plans()


@pytest.fixture(params=sorted(PLANS))
def case(request):
    plan = PLANS[request.param]
    return plan, render(plan, "summary", "img:1", "switchyard plan ...")


def _flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def _expected(plan: Plan) -> Counter:
    """(replica, node rank) for every node of every replica: each must be launched exactly once."""
    return Counter((r.name, k) for r in plan.replicas for k in range(len(r.nodes)))


def _commands(script: str) -> list[list[str]]:
    """The commands of a shell script or `sh -c` body, with `exec` and `until ...; do` loops unwrapped."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "export", "set ", "trap", "wait")) or line.endswith(("{", "}")):
            continue
        if line.startswith("until "):
            line = line.removeprefix("until ").split("; do ")[0].removesuffix(">/dev/null 2>&1").strip()
        argv = [a for a in shlex.split(line) if a not in ("exec", "&")]
        if argv:
            out.append(argv)
    return out


def check_launch(rep: Replica, k: int, cmds: list[list[str]], leader: str, node_rank: str) -> None:
    """The commands one node of `rep` runs are its runtime's, with the plan's shape and addresses."""
    main = cmds[-1]
    port = str(rep.port)
    if rep.runtime == "vllm":
        if len(rep.nodes) > 1 and k > 0:
            assert cmds == [["ray", "start", f"--address={leader}:{rep.master_port}", *main[3:]]], cmds
            assert main[-1] == "--block"
            return
        assert main[:3] == ["vllm", "serve", rep.model] and _flag(main, "--port") == port
        assert _flag(main, "--tensor-parallel-size") == str(rep.tensor_parallel)
        assert _flag(main, "--pipeline-parallel-size", "1") == str(rep.pp)
        assert _flag(main, "--served-model-name") == rep.served_name
        if len(rep.nodes) > 1:
            head, ready = cmds[0], cmds[1]
            assert head[:3] == ["ray", "start", "--head"] and f"--port={rep.master_port}" in head
            assert ready[:2] == ["python3", "-c"] and f"< {rep.tp})" in ready[2]
            assert _flag(main, "--distributed-executor-backend") == "ray"
        else:
            assert len(cmds) == 1
    elif rep.runtime == "sglang":
        assert len(cmds) == 1 and main[:3] == ["python3", "-m", "sglang.launch_server"]
        assert _flag(main, "--model-path") == rep.model and _flag(main, "--tp") == str(rep.tp)
        assert _flag(main, "--port") == port and _flag(main, "--served-model-name") == rep.served_name
        if len(rep.nodes) > 1:
            assert _flag(main, "--nnodes") == str(len(rep.nodes)) and _flag(main, "--node-rank") == node_rank
            assert _flag(main, "--dist-init-addr") == f"{leader}:{rep.master_port}"
        else:
            assert "--nnodes" not in main
    elif rep.runtime == "llama.cpp":
        assert len(cmds) == 1 and main[0].endswith("llama-server")
        assert (_flag(main, "-m") or _flag(main, "-hf")) == rep.model and _flag(main, "--port") == port
        assert _flag(main, "--alias") == rep.served_name and "--jinja" in main
    else:
        assert len(cmds) == 1 and "engine" in main and _flag(main, "--tp") == str(rep.tp)
        assert _flag(main, "--collective") == rep.collective and _flag(main, "--port") == port
        if rep.tp > 1:
            assert _flag(main, "--nproc-per-node") == str(rep.ranks_per_node)
        if len(rep.nodes) > 1:
            assert _flag(main, "--master-addr") == leader and _flag(main, "--node-rank") == node_rank
            assert _flag(main, "--master-port") == str(rep.master_port)
    assert rep.args == () or main[-len(rep.args):] == list(rep.args)


def test_every_yaml_parses_and_gateway_policies_carry_the_planned_replicas(case):
    plan, files = case
    for rel, text in files.items():
        if rel.endswith(".yaml"):
            docs = list(yaml.safe_load_all(text))
            assert docs and all(isinstance(d, dict) for d in docs), rel
    for rel in ("policy.yaml", "compose/policy.yaml"):
        spec = parse_policy(files[rel], rel)
        assert set(spec.pools) == set(plan.policy.pools) and spec.name == plan.policy.name
        assert sorted(r.name for p in spec.pools.values() for r in p.replicas) == sorted(r.name for r in plan.replicas)
        # The gateway sends each pool's own model name, which every runtime serves under.
        assert {n: p.model for n, p in spec.pools.items()} == {n: p.model for n, p in plan.policy.pools.items()}
    bare = parse_policy(files["policy.yaml"])
    assert {r.name: r.url for p in bare.pools.values() for r in p.replicas} == {r.name: r.url for r in plan.replicas}


def test_gateway_policies_pass_policy_check(tmp_path):
    """`switchyard policy check` (the CLI, as an operator runs it) on every gateway policy emitted."""
    paths = []
    for name, plan in PLANS.items():
        files = render(plan, "s", "img", "cmd")
        config = next(d for d in yaml.safe_load_all(files["k8s/switchyard.yaml"]) if d["kind"] == "ConfigMap")
        for rel, text in [("policy.yaml", files["policy.yaml"]), ("compose.yaml", files["compose/policy.yaml"]),
                          ("k8s.yaml", config["data"]["policy.yaml"])]:
            paths.append(tmp_path / f"{name}-{rel}")
            paths[-1].write_text(text)
    res = subprocess.run([sys.executable, "-m", "switchyard.cli", "policy", "check", *map(str, paths)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(": ok (") == len(paths)


def test_node_scripts_launch_every_replica_part_once(case):
    plan, files = case
    seen: Counter = Counter()
    scripts = [rel for rel in files if rel.startswith("nodes/node-")]
    assert sorted(scripts) == sorted(f"nodes/node-{n.name}.sh" for n in plan.cluster.nodes)
    for rel in scripts:
        node = rel.removeprefix("nodes/node-").removesuffix(".sh")
        body = files[rel]
        for rep, k in plan.on_node(node):
            fn = rep.name.replace("-", "_")
            part = body.split(f"\n{fn}() {{\n", 1)[1].split("\n}\n", 1)[0]
            check_launch(rep, k, _commands(part), rep.leader, str(k))
            if rep.runtime == "vllm" and len(rep.nodes) > 1:
                assert f"export VLLM_HOST_IP={rep.addresses[k]}" in part
            seen[(rep.name, k)] += 1
        assert body.count("() {") == len(plan.on_node(node))
    assert seen == _expected(plan)


def test_gateway_script_needs_the_admin_key_and_turns_keys_on(tmp_path):
    files = render(PLANS["spark8"], "s", "img", "cmd")
    write(tmp_path, files)
    script = tmp_path / "nodes" / "gateway.sh"
    assert "--auth" in script.read_text() and "--admin-key" not in script.read_text()
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin"})
    assert res.returncode != 0 and "SWITCHYARD_ADMIN_KEY" in res.stderr


def test_compose_is_valid_and_services_match_the_plan(case):
    plan, files = case
    doc = yaml.safe_load(files["compose/docker-compose.yaml"])
    assert compose_problems(doc) == []
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
        assert s["labels"]["switchyard.runtime"] == rep.runtime
        entry, args = s.get("entrypoint"), s.get("command", [])
        if entry and entry[:2] == ["sh", "-c"]:
            cmds = _commands(entry[2])
        else:
            cmds = [(entry or ["llama-server"]) + args]  # no entrypoint: the image's own (llama-server)
        check_launch(rep, k, cmds, f"{rep.pool}-{rep.index}-n0", str(k))
        assert [int(x) for x in s["labels"]["switchyard.ranks"].split(",")] == list(rep.ranks_on(k))
        seen[(rep.name, k)] += 1
        if rep.device == "cuda":
            assert s["deploy"]["resources"]["reservations"]["devices"][0]["count"] == rep.ranks_per_node
        if rep.runtime != "switchyard":
            assert s["env_file"] == [{"path": "hf.env", "required": False}] and s["image"] != "img:1"
        if rep.model.startswith("/"):  # a model on the host is mounted where the command names it
            assert "/models:/models:ro" in s["volumes"]
    assert seen == _expected(plan)
    assert placed == {(r.name, k): n for r in plan.replicas for k, n in enumerate(r.nodes)}
    policy = parse_policy(files["compose/policy.yaml"])
    urls = [r.url for p in policy.pools.values() for r in p.replicas]
    assert sorted(urls) == sorted(f"http://{r.pool}-{r.index}-n0:{r.port}/v1" for r in plan.replicas)
    assert all(u.split("//")[1].split(":")[0] in services for u in urls)
    gw = services["gateway"]
    assert "--auth" in gw["command"] and "redis://redis:6379/0" in gw["command"] and gw["env_file"] == ["gateway.env"]
    assert not any("key" in a.lower() for a in gw["command"])


def _k8s(files: dict[str, str]) -> list[dict]:
    return list(yaml.safe_load_all(files["k8s/switchyard.yaml"]))


def test_k8s_documents_validate_against_kubernetes_and_the_lws_crd(case):
    _, files = case
    docs = _k8s(files)
    problems = [p for d in docs for p in k8s_problems(d)]
    assert problems == []
    # The validators do refuse what a cluster would: a typo'd field, a wrong type, an unknown enum.
    lws = next((d for d in docs if d["kind"] == "LeaderWorkerSet"), None)
    if lws is not None:
        bad = json.loads(json.dumps(lws))
        bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
        bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["imagee"] = "x"
        assert len(k8s_problems(bad)) == 2
    dep = json.loads(json.dumps(next(d for d in docs if d["kind"] == "Deployment")))
    dep["spec"]["replicas"] = "one"
    assert k8s_problems(dep)


def _k8s_container_cmds(c: dict) -> list[list[str]]:
    argv = c.get("command", ["/app/llama-server"]) + c.get("args", [])  # no command: the image's entrypoint
    return _commands(argv[2]) if argv[:2] == ["sh", "-c"] else [argv]


def test_k8s_launches_every_replica_on_its_planned_nodes(case):
    plan, files = case
    docs = _k8s(files)
    seen: Counter = Counter()
    for lws in (d for d in docs if d["kind"] == "LeaderWorkerSet"):
        pool = lws["metadata"]["labels"]["switchyard.io/pool"]
        reps = plan.pool_replicas(pool)
        spec = lws["spec"]
        assert spec["replicas"] == len(reps) and spec["leaderWorkerTemplate"]["size"] == len(reps[0].nodes) > 1
        for role in ("leaderTemplate", "workerTemplate"):
            pod = spec["leaderWorkerTemplate"][role]["spec"]
            container = pod["containers"][0]
            k = 0 if role == "leaderTemplate" else 1
            rank = "0" if k == 0 else "$(LWS_WORKER_INDEX)"
            check_launch(reps[0], k, _k8s_container_cmds(container), "$(LWS_LEADER_ADDRESS)", rank)
            assert ("readinessProbe" in container) == (k == 0)
            slots = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
            assert slots == [r.name for r in reps]
        placement = json.loads(lws["metadata"]["annotations"]["switchyard.io/placement"])
        for name, parts in placement.items():
            rep = next(r for r in reps if r.name == name)
            assert [p["node"] for p in parts] == list(rep.nodes)
            for p in parts:
                seen[(name, p["node_rank"])] += 1
    for dep in (d for d in docs if d["kind"] == "Deployment" and "switchyard.io/replica" in d["metadata"]["labels"]):
        rep = next(r for r in plan.replicas if r.name == dep["metadata"]["labels"]["switchyard.io/replica"])
        pod = dep["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"kubernetes.io/hostname": rep.nodes[0]} and len(rep.nodes) == 1
        container = pod["containers"][0]
        check_launch(rep, 0, _k8s_container_cmds(container), rep.leader, "0")
        assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": rep.port}
        svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == dep["metadata"]["name"])
        assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
        seen[(rep.name, 0)] += 1
    assert seen == _expected(plan)
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    policy = parse_policy(config["data"]["policy.yaml"])
    urls = {r.name: r.url for p in policy.pools.values() for r in p.replicas}
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    for rep in plan.replicas:
        host = urls[rep.name].split("//")[1].split(":")[0]
        # Multi-node: the leader pod under LWS's headless service; single-node: the replica's Service.
        assert host == (f"switchyard-{rep.pool}-{rep.index}.switchyard-{rep.pool}" if len(rep.nodes) > 1
                        else f"switchyard-{rep.pool}-{rep.index}")
        assert host.split(".")[-1] in services or len(rep.nodes) > 1
    labels = [line.split()[3:5] for line in files["k8s/label-nodes.sh"].splitlines() if line.startswith("kubectl")]
    assert Counter(tuple(x) for x in labels) == Counter(
        (n, f"switchyard.io/slot={r.name}") for r in plan.replicas if len(r.nodes) > 1 for n in r.nodes
    )


def test_k8s_engines_get_models_cache_and_hf_token_and_the_gateway_its_admin_key(case):
    plan, files = case
    docs = _k8s(files)
    gateway = next(d for d in docs if d["metadata"]["name"] == "switchyard-gateway" and d["kind"] == "Deployment")
    c = gateway["spec"]["template"]["spec"]["containers"][0]
    assert "--auth" in c["command"] and not any("key" in a.lower() for a in c["command"])
    assert c["env"] == [{"name": "SWITCHYARD_ADMIN_KEY",
                         "valueFrom": {"secretKeyRef": {"name": "switchyard-admin", "key": "admin-key"}}}]
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"
            and d["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"]
    pods += [d["spec"]["leaderWorkerTemplate"][t]["spec"] for d in docs if d["kind"] == "LeaderWorkerSet"
             for t in ("leaderTemplate", "workerTemplate")]
    assert pods
    for pod in pods:
        engine = pod["containers"][0]
        mounts = {m["name"]: m["mountPath"] for m in engine["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["models"]["hostPath"]["type"] == "DirectoryOrCreate" and mounts["models"].startswith("/root/.cache/")
        if "model" in volumes:  # a model given as a path: the node's folder, read-only, at that path
            assert volumes["model"]["hostPath"] == {"path": "/models", "type": "Directory"}
            assert {"name": "model", "mountPath": "/models", "readOnly": True} in engine["volumeMounts"]
        hf = [e for e in engine.get("env", []) if e["name"] == "HF_TOKEN"]
        assert hf == [] or hf[0]["valueFrom"]["secretKeyRef"] == {"name": "switchyard-hf-token", "key": "HF_TOKEN",
                                                                  "optional": True}
    secrets = files["k8s/secrets.sh"]
    assert "switchyard-admin" in secrets and "switchyard-hf-token" in secrets and "--from-file=admin-key=/dev/stdin" in secrets


def test_compose_secrets_script_writes_private_env_files(tmp_path):
    write(tmp_path, render(PLANS["ring4"], "s", "img", "cmd"))
    env = {"PATH": "/usr/bin:/bin", "HF_TOKEN": "hf_test"}
    res = subprocess.run(["bash", str(tmp_path / "compose" / "secrets.sh")], capture_output=True, text=True,
                         timeout=30, env=env)
    assert res.returncode == 0, res.stderr
    gateway_env = tmp_path / "compose" / "gateway.env"
    key = gateway_env.read_text().strip().removeprefix("SWITCHYARD_ADMIN_KEY=")
    assert len(key) == 48 and gateway_env.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "compose" / "hf.env").read_text() == "HF_TOKEN=hf_test\n"
    subprocess.run(["bash", str(tmp_path / "compose" / "secrets.sh")], check=True, timeout=30, env=env)
    assert gateway_env.read_text().strip().endswith(key)  # kept, not rotated


def test_ring_scripts_use_the_ring_collective_and_nics():
    plan = plan_of(make_cluster(4, "ring", nodes=[{"name": f"n{i}", "address": f"10.1.0.{i}", "nics": ["eth9"]}
                                                  for i in range(1, 5)]),
                   make_policy(large={"nodes_per_replica": 2, "engine": {"model": "m"}}))
    a = render(plan, "s", "img", "cmd")["nodes/node-n1.sh"]
    assert "--collective ring" in a and "export NCCL_SOCKET_IFNAME=eth9" in a


def test_write_replaces_its_own_output_and_refuses_foreign_folders(tmp_path: Path):
    files = render(PLANS["spark8"], "s", "img", "cmd")
    out = tmp_path / "out"
    write(out, files)
    (out / "nodes" / "node-stale.sh").write_text("old")
    (out / "torchrun").mkdir()  # what an older `plan --emit` wrote
    write(out, files)
    assert not (out / "nodes" / "node-stale.sh").exists() and not (out / "torchrun").exists()
    assert (out / "nodes" / "node-spark-1.sh").stat().st_mode & 0o111
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(EmitError, match="not written by `switchyard plan`"):
        write(foreign, files)
    assert (foreign / "notes.txt").read_text() == "keep me"
