"""plan_local: the one-node plan `switchyard up` launches from."""

from __future__ import annotations

import sys

import pytest
import yaml

from switchyard.cluster.local import local_launches, plan_local
from switchyard.cluster.placement import PlanError
from switchyard.policy.loader import parse_policy

POLICY = {
    "version": 1,
    "pools": {
        "small": {"model": "smollm2-135m", "replicas": [{"url": "http://127.0.0.1:8101/v1"}],
                  "engine": {"model": "smollm2-135m"}},
        "large": {"model": "smollm2-135m-tp3", "replicas": [{"url": "http://127.0.0.1:8201/v1"}, {"url": "http://127.0.0.1:8202/v1"}],
                  "engine": {"model": "smollm2-135m", "tp": 3, "collective": "oneshot"}},
        "remote": {"model": "gpt-x", "replicas": [{"url": "http://127.0.0.1:9000/v1"}]},
    },
    "routes": [{"name": "default", "pool": "small"}],
}  # fmt: skip


def test_local_plan_uses_the_policy_urls_and_shares_the_node():
    plan = plan_local(parse_policy(yaml.safe_dump(POLICY)))
    assert plan.cluster.name == "local" and plan.cluster.share_nodes
    got = {r.name: (r.leader, r.port, r.tp, r.collective) for r in plan.replicas}
    assert got == {
        "small-0": ("127.0.0.1", 8101, 1, "auto"),
        "large-0": ("127.0.0.1", 8201, 3, "oneshot"),
        "large-1": ("127.0.0.1", 8202, 3, "oneshot"),
        "remote-0": ("127.0.0.1", 9000, 1, "auto"),
    }


def test_local_launches_give_commands():
    launches = {x.replica: x for x in local_launches(parse_policy(yaml.safe_dump(POLICY)), python="/py")}
    small = launches["small-0"].command
    assert small == [
        "/py", "-m", "switchyard.cli", "engine", "serve", "--model", "smollm2-135m", "--tp", "1",
        "--collective", "auto", "--port", "8101", "--host", "127.0.0.1", "--device", "cpu",
    ]  # fmt: skip
    large = launches["large-1"].command
    # TP > 1 on this machine: `engine serve --tp 3` supervises its ranks (an orderly Ctrl-C), not torchrun.
    assert large[:5] == ["/py", "-m", "switchyard.cli", "engine", "serve"]
    assert large[large.index("--tp") + 1] == "3" and large[large.index("--port") + 1] == "8202"
    assert launches["remote-0"].command is None and launches["large-1"].url == "http://127.0.0.1:8202/v1"
    default = local_launches(parse_policy(yaml.safe_dump(POLICY)))
    assert default[0].command is not None and default[0].command[0] == sys.executable


def test_local_plan_refuses_two_replicas_on_one_port():
    clash = yaml.safe_load(yaml.safe_dump(POLICY))
    clash["pools"]["small"]["replicas"] = [{"url": "http://127.0.0.1:8201/v1"}]
    with pytest.raises(PlanError, match="both serve on 127.0.0.1:8201"):
        plan_local(parse_policy(yaml.safe_dump(clash)))
