"""One routing function: the same requests through every entry point give the same decisions
and traces.

Entry points: the gateway's proxy (its decisions as `serve --record` writes them), `/v1/route`,
the UI preview, `switchyard policy explain --json`, replay's dry run and its counterfactual.
The requests cover a fail-open label, a session pinned to its pool through a tool loop,
escalate-only, a weighted split fixed per session, and a fallback chain. The classifier is
real: an llm classifier asking a real label server (its own process) over HTTP, and one whose
pool is dead, so it fails open. The gateway (recording as `serve --record` does) and its
upstreams run in process (tests/gateway/inproc.py); `serve --record` as a process is tested by
test_hardening*.py and tests/replay/test_live.py.

`/v1/route` and the preview read a session's state and never write it: each is asked about a
turn just before the proxy serves it, so it starts from the state the proxy's earlier turns
left, and so must decide as the proxy does.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import inproc
import orjson
import pytest
from procs import ROOT, Proc, free_port
from typer.testing import CliRunner

from switchyard.cli import app as cli_app

LABEL_SERVER = ROOT / "tests" / "classify" / "label_server.py"
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def _policy(path: Path, name: str, judge_url: str, small: str, large: str) -> Path:
    path.write_text(
        f"version: 1\nname: {name}\n"
        "pools:\n"
        f"  small: {{model: s, replicas: [{{url: '{small}/v1'}}]}}\n"
        f"  large: {{model: l, replicas: [{{url: '{large}/v1'}}]}}\n"
        f"  judge: {{model: j, replicas: [{{url: '{judge_url}/v1'}}], retries: 0, health: {{interval: 0}}}}\n"
        "classifier: {kind: llm, pool: judge, timeout: 2s, on_failure: complex,\n"
        "             classify_on: user_turn, escalate_only: true}\n"
        "session: {pin: pool}\n"
        "routes:\n"
        "  - {name: big-toolset, when: {tools: '>= 3'}, pool: large}\n"
        "  - {name: hard, when: {label: complex, confidence: '>= 0.6'}, pool: large}\n"
        "  - {name: canary, when: {text: canary}, pool: {large: 50, small: 50}}\n"
        "  - {name: default, pool: small}\n"
        "fallback:\n  small: [large]\n"
    )
    return path


def _turns(*users: str, tool_loop: bool = False, tools: int = 1) -> dict:
    msgs: list[dict] = []
    for u in users:
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": "ok"}]
    msgs = msgs[:-1]
    if tool_loop:
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    return {"messages": msgs, "tools": [TOOL] * tools}


# (session id, request) in the order sent. The session "s1" is classified simple and goes to
# small; in its tool loop (the same user turn, label kept) a big toolset would send it to large,
# but the pin keeps it on small; a HARD turn escalates it; escalate-only keeps it large when its
# next turn is simple again. Three split sessions land where their hash says.
REQUESTS: list[tuple[str | None, dict]] = [
    ("s1", _turns("what is the weather")),
    ("s1", _turns("what is the weather", tool_loop=True, tools=4)),
    ("s1", _turns("what is the weather", "now a HARD plan with many steps")),
    ("s1", _turns("what is the weather", "now a HARD plan with many steps", "thanks, and the time?")),
    (None, _turns("a HARD one, alone")),
    (None, _turns("an easy one, alone")),
    (None, _turns("many tools", tools=4)),
    ("split-a", _turns("canary please")),
    ("split-e", _turns("canary please")),
    ("split-g", _turns("canary please")),
]
# The time a classifier took is the one thing that differs from run to run.
NOISE = ("classifier_ms",)


def _clean(trace: dict) -> dict:
    return {k: v for k, v in trace.items() if k not in NOISE and k in KEYS}


KEYS = ("policy", "pool", "rule", "reason", "label", "confidence", "classifier", "fallbacks", "replica",
        "session_id", "classifier_error", "trace", "session")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("equiv")
    port = free_port()
    judge = Proc([sys.executable, str(LABEL_SERVER), "--port", str(port), "--mode", "keyword"],
                 f"http://127.0.0.1:{port}/health", tmp / "judge.log")
    try:
        with inproc.stack() as s:
            small_url, large_url = s.upstream("small").url, s.upstream("large").url
            live = _policy(tmp / "live.yaml", "live", f"http://127.0.0.1:{port}", small_url, large_url)
            dead = _policy(tmp / "dead.yaml", "dead", f"http://127.0.0.1:{free_port()}", small_url, large_url)
            record = tmp / "recorded.jsonl"
            gw = s.gateway([live, dead], record=str(record), health_checks=False)
            yield tmp, gw.serve(), live, dead, record
    finally:
        judge.stop()


def _send_all(url: str, policy: str, path: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """Every request through the proxy, in order; before each, `/v1/route` and the UI preview
    (the running policy's decision, and the edited one's for the same text) on the same turn.
    Were either to write the session's state, the proxy's decision on that turn would start
    from it (a label reused where explain and replay classify), and the comparisons fail."""
    routes, running, edited = [], [], []
    text = path.read_text()
    with httpx.Client(timeout=30, trust_env=False) as c:
        for sid, body in REQUESTS:
            headers = {"x-session-id": sid} if sid else {}
            request = {**body, "model": policy}
            r = c.post(url + "/v1/route", json=request, headers=headers)
            assert r.status_code == 200, r.text
            routes.append(r.json())
            p = c.post(url + "/ui/api/policies/preview",
                       json={"name": policy, "text": text, "request": request, "headers": headers})
            assert p.status_code == 200, p.text
            running.append(p.json()["running"])
            edited.append(p.json()["edited"])
            r = c.post(url + "/v1/chat/completions", json=request, headers=headers)
            assert r.status_code == 200, r.text
    return routes, running, edited


def _recorded(record: Path, policy: str, expect: int) -> list[dict]:
    """The gateway's recorded decisions for `policy`, once its background writer has written
    `expect` of them (it writes after the response: a line may land a moment later)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [orjson.loads(x) for x in record.read_bytes().splitlines() if x.strip()]
        got = [x["_switchyard"]["decision"] for x in lines if x["model"] == policy]
        if len(got) >= expect or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def _explain(tmp: Path, policy: Path) -> list[dict]:
    """`policy explain --json`: each session's requests in one call, routed in order."""
    out = {}
    for sid in dict.fromkeys(s for s, _ in REQUESTS):
        idx = [i for i, (s, _) in enumerate(REQUESTS) if s == sid]
        files = []
        for i in idx:
            f = tmp / f"req{i}.json"
            f.write_text(json.dumps(REQUESTS[i][1]))
            files += ["-r", str(f)]
        session = ["-H", f"x-session-id: {sid}"] if sid else []
        res = CliRunner().invoke(cli_app, ["policy", "explain", str(policy), *files, *session, "--json"])
        assert res.exit_code == 0, res.output
        for i, line in zip(idx, res.output.strip().splitlines(), strict=True):
            out[i] = json.loads(line)
    return [out[i] for i in range(len(REQUESTS))]


def _replay(tmp: Path, policy: Path, name: str) -> tuple[list[dict], list[dict]]:
    """Replay's dry run over a JSONL trace, and its counterfactual over an outcomes file."""
    trace = tmp / f"trace-{name}.jsonl"
    outcomes = tmp / f"outcomes-{name}.jsonl"
    with trace.open("w") as t, outcomes.open("w") as o:
        for i, (sid, body) in enumerate(REQUESTS):
            t.write(json.dumps({"id": f"r{i}", **({"session_id": sid} if sid else {}), **body}) + "\n")
            for pool in ("small", "large"):
                o.write(json.dumps({"id": f"r{i}", "pool": pool, "correct": True, "session_id": sid,
                                    "request": {"model": pool, **body}}) + "\n")
    runs = []
    for args in (["replay", str(trace), "--dry-run"], ["replay", "--from-outcomes", str(outcomes)]):
        out = tmp / f"out-{name}-{len(runs)}"
        res = CliRunner().invoke(cli_app, [*args, "-p", str(policy), "--out", str(out)])
        assert res.exit_code == 0, res.output
        cases = json.loads((out / "report.json").read_text())["runs"][0]["cases"]
        runs.append([c["trace"] for c in sorted(cases, key=lambda c: int(c["id"][1:]))])
    return runs[0], runs[1]


@pytest.mark.parametrize("policy", ["live", "dead"])
def test_every_entry_point_routes_alike(setup, policy):
    tmp, url, live, dead, record = setup
    path = live if policy == "live" else dead
    routes, running, edited = _send_all(url, policy, path)
    gateway = [_clean(t) for t in _recorded(record, policy, len(REQUESTS))]
    assert len(gateway) == len(REQUESTS)

    explained = [_clean(t) for t in _explain(tmp, path)]
    dry, counterfactual = (list(map(_clean, r)) for r in _replay(tmp, path, policy))
    assert explained == gateway
    assert dry == gateway
    assert counterfactual == gateway
    assert [_clean(r) for r in routes] == gateway
    assert [_clean(p) for p in running] == gateway
    assert [_clean(p) for p in edited] == gateway
    # Each session-bearing turn after the first started from the record its earlier turns left.
    assert [g["session"] is not None for g in gateway] == [
        sid is not None and any(s == sid for s, _ in REQUESTS[:i]) for i, (sid, _) in enumerate(REQUESTS)]

    pools = [g["pool"] for g in gateway]
    rules = [g["rule"] for g in gateway]
    labels = [(g["label"], g["classifier"], g["confidence"]) for g in gateway]
    if policy == "live":
        # s1: simple -> small; the tool loop keeps the turn's label; a HARD turn escalates; a simple
        # turn after it stays large (escalate-only), its label carried by the session.
        assert pools[:4] == ["small", "small", "large", "large"] and rules[1] == "session-pin"
        assert labels[0][:2] == ("simple", "llm") and labels[1][:2] == ("simple", "session")
        assert labels[2][:2] == ("complex", "llm") and labels[3][:2] == ("complex", "session")
        assert pools[4:7] == ["large", "small", "large"] and rules[6] == "big-toolset"
        assert pools[7:] == ["large", "small", "small"]  # the split, fixed per session by its hash
        assert all(g["fallbacks"] == (["large"] if g["pool"] == "small" else []) for g in gateway)
    else:
        # The judge pool is dead: every label fails open to `on_failure` with confidence 1.0,
        # so the confidence-gated rule sends it where `on_failure` means it to go.
        assert all(lab[1] in ("fail-open", "session") for lab in labels)
        assert all(lab[0] == "complex" and lab[2] == 1.0 for lab in labels)
        assert set(pools) == {"large"}
        assert "hard" in rules
