"""Policy files: validation with line numbers, every predicate, splits, sessions, hot reload, the CLI."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import inproc
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from procs import ROOT, http_get, http_post, start_gateway, start_upstream

from switchyard.classify.base import Label
from switchyard.classify.features import extract
from switchyard.gateway.gateway import Gateway
from switchyard.policy.loader import PolicyError, parse_policy
from switchyard.policy.rules import compile_policy
from switchyard.state.memory import MemoryStore

BASE = """version: 1
pools:
  small: {model: s, replicas: [{url: "http://127.0.0.1:1/v1"}]}
  large: {model: l, replicas: [{url: "http://127.0.0.1:2/v1"}]}
"""


def policy(routes: str, extra: str = "") -> str:
    return BASE + extra + "routes:\n" + routes


def route(text: str, body: dict, headers: dict | None = None, label: Label | None = None, sid: str | None = None):
    spec = parse_policy(text, "t.yaml")
    f = extract(body, headers or {})
    return compile_policy(spec).evaluate(f, label or Label("", 0.0), sid)[0]


def chat(content: str = "hi", tools: int = 0, **kw) -> dict:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    return {"model": "auto", "messages": [{"role": "user", "content": content}], "tools": [tool] * tools, **kw}


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,line,reason",
    [
        (BASE + "routes:\n  - name: a\n    pool: medium\n", 7, "unknown pool 'medium'"),
        (BASE + "routes:\n  - name: a\n    when: {tool: 3}\n    pool: small\n", 7, "unknown predicate 'tool'"),
        (BASE + "routes:\n  - name: a\n    when: {text: '(unclosed'}\n    pool: small\n", 7, "bad regular expression"),
        (BASE + "routes:\n  - name: a\n    when: {tools: 'lots'}\n    pool: small\n", 7, "comparison"),
        (BASE.replace("model: s,", "model: s, strategy: fastest,") + "routes:\n  - {name: a, pool: small}\n", 3,
         "strategy"),
        (BASE + "routes:\n  - {name: a, pool: small}\nfallback:\n  small: [huge]\n", 8, "unknown pool 'huge'"),
        (BASE + "routes: []\n", 5, "routes"),
        (BASE + "routes:\n  - {name: a, pool: small}\nsession: {ttl: forever}\n", 7, "duration"),
        ("version: 1\npools:\n  small: {model: s, replicas: [{url: 'ftp://x'}]}\nroutes:\n  - {name: a, pool: small}\n",
         3, "http://"),
        ("version: 1\npools: {a: {model: x, replicas: []}}\nroutes: [{name: r, pool: a}]\n", 2, "at least one replica"),
        ("version: 1\npools:\n  a: [\n", 4, "YAML syntax"),
        ("", 1, "empty"),
        ("- just\n- a list\n", 1, "mapping"),
        (BASE + "routes:\n  - {name: a, pool: {small: -1, large: 2}}\n", 6, "weight"),
    ],
)
def test_invalid_policy_names_file_line_and_reason(text, line, reason):
    with pytest.raises(PolicyError) as e:
        parse_policy(text, "my.yaml")
    issue = e.value.issues[0]
    assert issue.file == "my.yaml"
    assert reason in issue.reason, issue
    assert issue.line == line, issue


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_random_text_never_crashes_the_loader(text):
    try:
        parse_policy(text, "fuzz.yaml")
    except PolicyError as e:
        assert e.issues and all(i.file == "fuzz.yaml" and i.reason for i in e.issues)


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
policy_keys = st.sampled_from(["version", "pools", "routes", "classifier", "session", "fallback", "name", "x"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(policy_keys, yaml_values, max_size=6))
def test_random_yaml_structures_are_rejected_not_crashed(doc):
    text = yaml.safe_dump(doc)
    try:
        parse_policy(text, "fuzz.yaml")
    except PolicyError as e:
        assert all(i.line >= 1 for i in e.issues)


def test_example_policy_is_valid():
    spec = parse_policy((ROOT / "policies" / "example.yaml").read_text(), "example.yaml")
    assert spec.name == "example" and set(spec.pools) == {"small", "large"}


# --- predicates -----------------------------------------------------------------------------


def test_each_predicate_routes():
    p = policy(
        "  - {name: tools, when: {tools: '>= 3'}, pool: large}\n"
        "  - {name: label, when: {label: complex, confidence: '>= 0.6'}, pool: large}\n"
        "  - {name: turns, when: {turns: '> 2'}, pool: large}\n"
        "  - {name: long, when: {prompt_tokens: '> 1000'}, pool: large}\n"
        "  - {name: model, when: {model: [big-please]}, pool: large}\n"
        "  - {name: header, when: {header.x-tier: gold}, pool: large}\n"
        "  - {name: text, when: {text: '(?i)refactor'}, pool: large}\n"
        "  - {name: toolres, when: {tool_result: true}, pool: large}\n"
        "  - {name: default, pool: small}\n"
    )
    assert route(p, chat()).rule == "default"
    assert route(p, chat(tools=3)).rule == "tools"
    assert route(p, chat(tools=2)).rule == "default"
    assert route(p, chat(), label=Label("complex", 0.7, "onnx")).rule == "label"
    assert route(p, chat(), label=Label("complex", 0.5, "onnx")).rule == "default"
    assert route(p, chat(), label=Label("simple", 0.9, "onnx")).rule == "default"
    many = {"model": "auto", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}] * 3}
    assert route(p, many).rule == "turns"
    assert route(p, chat("x" * 5000)).rule == "long"
    assert route(p, chat(model="big-please") | {"model": "big-please"}).rule == "model"
    assert route(p, chat(), {"x-tier": "gold"}).rule == "header"
    assert route(p, chat(), {"x-tier": "bronze"}).rule == "default"
    assert route(p, chat("please REFACTOR this")).rule == "text"
    tool_loop = {"model": "auto", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "sunny"}]},
    ]}
    assert route(p, tool_loop).rule == "toolres"


def test_structured_output_predicates_route():
    p = policy(
        "  - {name: must-call, when: {tool_choice: [required, named]}, pool: large}\n"
        "  - {name: schema, when: {response_format: json_schema}, pool: large}\n"
        "  - {name: default, pool: small}\n"
    )
    assert route(p, chat(tools=1)).rule == "default"  # no tool_choice given
    assert route(p, chat(tools=1, tool_choice="auto")).rule == "default"
    assert route(p, chat(tools=1, tool_choice="required")).rule == "must-call"
    named = {"type": "function", "function": {"name": "f"}}
    assert route(p, chat(tools=1, tool_choice=named)).rule == "must-call"
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert route(p, chat(response_format=fmt)).rule == "schema"
    assert route(p, chat(response_format={"type": "json_object"})).rule == "default"
    with pytest.raises(PolicyError, match="tool_choice: \\['always'\\] is not one of"):
        parse_policy(policy("  - {name: x, when: {tool_choice: always}, pool: large}\n"), "t.yaml")


def test_first_match_wins_and_all_predicates_must_hold():
    p = policy(
        "  - {name: both, when: {tools: '>= 1', text: 'urgent'}, pool: large}\n"
        "  - {name: any-tools, when: {tools: '>= 1'}, pool: small}\n"
        "  - {name: default, pool: small}\n"
    )
    assert route(p, chat("urgent", tools=1)).rule == "both"
    assert route(p, chat("calm", tools=1)).rule == "any-tools"
    assert route(p, chat("urgent")).rule == "default"


def test_split_is_deterministic_per_session_and_follows_weights():
    compiled = compile_policy(parse_policy(policy("  - {name: canary, pool: {large: 25, small: 75}}\n")))
    f, lab = extract(chat(), {}), Label("", 0.0)
    for sid in ("alice", "bob", "carol"):
        pools = {compiled.evaluate(f, lab, sid)[0].pool for _ in range(20)}
        assert len(pools) == 1
    counts = Counter(compiled.evaluate(f, lab, f"s{i}")[0].pool for i in range(4000))
    assert 0.21 < counts["large"] / 4000 < 0.29
    counts = Counter(compiled.evaluate(f, lab, None)[0].pool for _ in range(4000))  # no session: random
    assert 0.21 < counts["large"] / 4000 < 0.29


# --- sessions: pinning, classify_on, escalate_only (through Gateway.route) -----------------------


class ScriptedClassifier:
    """Returns labels from a script, so session logic is tested on its own."""

    kind = "onnx"

    def __init__(self, labels):
        self.labels = list(labels)
        self.calls = 0

    async def classify(self, features, body):
        self.calls += 1
        return Label(self.labels.pop(0), 0.9, "onnx", 0.01)

    async def aclose(self):
        return None


def gateway_for(tmp_path, text: str) -> Gateway:
    f = tmp_path / "p.yaml"
    f.write_text(text)
    g = Gateway(MemoryStore())
    g.load([f])
    return g


def turns(*contents: str, tool_result: bool = False) -> dict:
    msgs = []
    for c in contents:
        msgs += [{"role": "user", "content": c}, {"role": "assistant", "content": "ok"}]
    msgs = msgs[:-1]
    if tool_result:
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "1", "content": "result"}]
    return {"model": "auto", "messages": msgs}


SESSION_RULES = "  - {name: hard, when: {label: complex}, pool: large}\n  - {name: default, pool: small}\n"


def test_user_turn_keeps_label_through_tool_loop_and_reclassifies_next_turn(tmp_path):
    g = gateway_for(tmp_path, policy(SESSION_RULES, "classifier: {kind: none, classify_on: user_turn}\n"))
    lp = g.policies()[0]
    lp.spec = lp.spec.model_copy(update={"classifier": lp.spec.classifier.model_copy(update={"kind": "onnx"})})
    clf = lp.classifier = ScriptedClassifier(["complex", "simple"])

    async def go(body):
        t = g.resolve("auto")
        return (await g.route(t, extract(body, {}), body, "sess-1")).decision

    d1 = asyncio.run(go(turns("plan a trip")))
    d2 = asyncio.run(go(turns("plan a trip", tool_result=True)))  # same turn, tool loop
    assert (d1.pool, d2.pool) == ("large", "large") and clf.calls == 1
    assert d2.label.kind == "session"
    d3 = asyncio.run(go(turns("plan a trip", "thanks")))  # a new user message: classified again
    assert clf.calls == 2 and d3.pool == "small"


def test_escalate_only_never_goes_back(tmp_path):
    g = gateway_for(tmp_path, policy(SESSION_RULES, "classifier: {kind: none, escalate_only: true}\n"))
    lp = g.policies()[0]
    lp.spec = lp.spec.model_copy(update={"classifier": lp.spec.classifier.model_copy(update={"kind": "onnx"})})
    lp.classifier = ScriptedClassifier(["simple", "complex", "simple"])

    async def go(body):
        return (await g.route(g.resolve("auto"), extract(body, {}), body, "sess-2")).decision

    assert asyncio.run(go(turns("a"))).pool == "small"
    assert asyncio.run(go(turns("a", "b"))).pool == "large"
    d = asyncio.run(go(turns("a", "b", "c")))
    assert d.pool == "large" and d.label.name == "complex"


def test_new_session_classifies_once(tmp_path):
    g = gateway_for(tmp_path, policy(SESSION_RULES, "classifier: {kind: none, classify_on: new_session}\n"))
    lp = g.policies()[0]
    lp.spec = lp.spec.model_copy(update={"classifier": lp.spec.classifier.model_copy(update={"kind": "onnx"})})
    clf = lp.classifier = ScriptedClassifier(["complex"])
    for i in range(4):
        body = turns(*[f"m{j}" for j in range(i + 1)])
        assert asyncio.run(g.route(g.resolve("auto"), extract(body, {}), body, "s")).decision.pool == "large"
    assert clf.calls == 1


def test_pin_pool_keeps_a_session_on_its_pool(tmp_path):
    text = policy("  - {name: t, when: {tools: '>= 2'}, pool: large}\n  - {name: default, pool: small}\n",
                  "session: {pin: pool}\n")
    g = gateway_for(tmp_path, text)
    b1, b2 = chat(tools=2), chat(tools=0)
    d1 = asyncio.run(g.route(g.resolve("auto"), extract(b1, {}), b1, "pinned")).decision
    d2 = asyncio.run(g.route(g.resolve("auto"), extract(b2, {}), b2, "pinned")).decision
    d3 = asyncio.run(g.route(g.resolve("auto"), extract(b2, {}), b2, "other")).decision
    assert (d1.pool, d2.pool, d2.rule, d3.pool) == ("large", "large", "session-pin", "small")


# --- end to end: sessions, reload, CLI -------------------------------------------------------
# In process (tests/gateway/inproc.py): the gateway's logic, real sockets to the upstreams. The
# hot reload of a served folder stays a real `switchyard serve` process, the CLI a real command.


@pytest.fixture
def stk() -> Iterator[inproc.Stack]:
    with inproc.stack() as s:
        yield s


def wait_for(cond, seconds: float = 4.0) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_session_stickiness_and_replica_pin_end_to_end(tmp_path, stk):
    ups = [stk.upstream(f"r{i}") for i in range(3)]
    p = tmp_path / "pin.yaml"
    p.write_text(
        "version: 1\nname: pin\npools:\n  small:\n    model: m\n    strategy: round_robin\n    replicas:\n"
        + "".join(f"      - {{url: {u.url}/v1, name: r{i}}}\n" for i, u in enumerate(ups))
        + "session: {pin: replica}\nroutes:\n  - {name: default, pool: small}\n"
    )
    gw = stk.gateway([p])

    def replica(sid: str | None) -> str:
        req = {"model": "auto", "messages": [{"role": "user", "content": "x"}]}
        if sid:
            req["metadata"] = {"session_id": sid}
        r = gw.post("/v1/chat/completions", json=req)
        assert r.status_code == 200
        return r.json()["system_fingerprint"]

    assert len({replica(None) for _ in range(6)}) == 3  # round robin without a session
    for sid in ("a", "b", "c", "d"):
        assert len({replica(sid) for _ in range(5)}) == 1  # pinned to one replica
    # The session id may also come from the header or `user`.
    r = gw.post("/v1/route", json={"model": "auto", "user": "u1", "messages": [{"role": "user", "content": "x"}]})
    assert r.json()["session_id"] == "u1"


@pytest.mark.slow
def test_hot_reload_swaps_a_good_edit_and_keeps_serving_on_a_broken_one(tmp_path):
    """A real process serving a folder: the watcher, the log a broken edit leaves, a second policy."""
    (u0, url0), (u1, url1) = start_upstream(tmp_path, "a"), start_upstream(tmp_path, "b")
    folder = tmp_path / "policies"
    folder.mkdir()
    p = folder / "live.yaml"
    text = ("version: 1\nname: live\npools:\n  a: {{model: m, replicas: [{{url: {a}/v1}}]}}\n"
            "  b: {{model: m, replicas: [{{url: {b}/v1}}]}}\nroutes:\n  - {{name: r, pool: {target}}}\n")
    p.write_text(text.format(a=url0, b=url1, target="a"))
    (folder / "beta.yaml").write_text(f"version: 1\npools:\n  beta-pool: {{model: m-beta, replicas: [{{url: {url1}/v1}}]}}\n"
                                      "routes:\n  - {name: r, pool: beta-pool}\n")
    gw, url = start_gateway(tmp_path, [folder])  # a folder: every *.yaml in it

    def pool_now() -> str:
        status, raw = http_post(url + "/v1/route", b'{"model": "live", "messages": [{"role": "user", "content": "x"}]}')
        return orjson.loads(raw)["pool"]

    try:
        ids = {m["id"] for m in orjson.loads(http_get(url + "/v1/models")[1])["data"]}
        assert {"live", "beta", "beta-pool", "m-beta"} <= ids
        assert pool_now() == "a"
        p.write_text(text.format(a=url0, b=url1, target="b"))
        assert wait_for(lambda: pool_now() == "b", 10), gw.output()
        p.write_text(text.format(a=url0, b=url1, target="nowhere"))  # invalid: unknown pool
        assert wait_for(lambda: "unknown pool 'nowhere'" in gw.output(), 10)
        assert f"{p}:7" in gw.output()
        assert pool_now() == "b"  # the running policy stays
        health = orjson.loads(http_get(url + "/health")[1])
        assert health["policies"]["live"]["last_reload"]["ok"] is False
        status, raw = http_post(url + "/v1/chat/completions",
                                b'{"model": "live", "messages": [{"role": "user", "content": "x"}]}')
        assert status == 200
    finally:
        gw.stop()
        u0.stop()
        u1.stop()


def test_hot_reload_in_process(tmp_path, stk):
    a, b = stk.upstream("a"), stk.upstream("b")
    p = tmp_path / "live.yaml"
    text = ("version: 1\nname: live\npools:\n  a: {{model: m, replicas: [{{url: {a}/v1}}]}}\n"
            "  b: {{model: m, replicas: [{{url: {b}/v1}}]}}\nroutes:\n  - {{name: r, pool: {target}}}\n")
    p.write_text(text.format(a=a.url, b=b.url, target="a"))
    gw = stk.gateway([p])

    def pool_now() -> str:
        return gw.post("/v1/route", json={"messages": [{"role": "user", "content": "x"}]}).json()["pool"]

    assert pool_now() == "a"
    p.write_text(text.format(a=a.url, b=b.url, target="b"))
    assert wait_for(lambda: pool_now() == "b", 10), gw.output()
    p.write_text(text.format(a=a.url, b=b.url, target="nowhere"))  # invalid: unknown pool
    assert wait_for(lambda: "unknown pool 'nowhere'" in gw.output(), 10)
    assert f"{p}:7" in gw.output()
    assert pool_now() == "b"  # the running policy stays
    assert gw.get("/health").json()["policies"]["live"]["last_reload"]["ok"] is False
    r = gw.post("/v1/chat/completions", json={"model": "live", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200 and r.json()["system_fingerprint"] == "b"


def _connections_to(port: int) -> int:
    """Established TCP connections to 127.0.0.1:port on this host (from /proc/net/tcp)."""
    n = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state = fields[2], fields[3]
        if state == "01" and int(remote.split(":")[1], 16) == port:
            n += 1
    return n


def test_a_policy_edit_that_drops_a_replica_closes_its_connections(tmp_path, stk):
    # The upstreams keep idle connections a minute: only the gateway closing them ends them soon.
    u0, u1 = stk.upstream("keep", keep_alive=60), stk.upstream("drop", keep_alive=60)
    p = tmp_path / "live.yaml"
    text = ("version: 1\nname: live\npools:\n  a: {{model: m, replicas: [{replicas}]}}\n"
            "routes:\n  - {{name: r, pool: a}}\n")
    p.write_text(text.format(replicas=f"{{url: {u0.url}/v1}}, {{url: {u1.url}/v1}}"))
    gw = stk.gateway([p], health_checks=False)
    body = {"model": "live", "messages": [{"role": "user", "content": "x"}]}
    for _ in range(4):  # round the pool: both replicas get a kept-alive connection
        assert gw.post("/v1/chat/completions", json=body).status_code == 200
    assert _connections_to(u1.port) >= 1
    p.write_text(text.format(replicas=f"{{url: {u0.url}/v1}}"))
    assert wait_for(lambda: _connections_to(u1.port) == 0), "the dropped replica's connection pool is still open"
    assert gw.post("/v1/chat/completions", json=body).status_code == 200


@pytest.mark.slow  # seconds of waiting or load by design: `make test`
def test_a_replica_dropped_while_serving_is_closed_when_its_last_request_ends(tmp_path, stk):
    # The edit's prune must leave the busy replica alone (the request is answered), and with no
    # further edit to come, the end of that request is what closes its connection pool.
    u0, u1 = stk.upstream("keep", keep_alive=60), stk.upstream("slow", keep_alive=60)
    p = tmp_path / "live.yaml"
    text = "version: 1\nname: live\npools:\n  a: {{model: m, replicas: [{{url: {url}/v1}}]}}\nroutes:\n  - {{name: r, pool: a}}\n"
    p.write_text(text.format(url=u1.url))
    gw = stk.gateway([p], health_checks=False)
    body = {"model": "live", "messages": [{"role": "user", "content": "x"}]}

    def replicas() -> list[dict]:
        return gw.get("/health").json()["policies"]["live"]["pools"]["a"]["replicas"]

    answered: list[int] = []
    assert gw.post("/v1/chat/completions", json=body).status_code == 200
    assert http_post(u1.url + "/_control", b'{"delay_ms": 3000}')[0] == 200
    slow = threading.Thread(target=lambda: answered.append(gw.post("/v1/chat/completions", json=body).status_code))
    slow.start()
    assert wait_for(lambda: replicas()[0]["inflight"] == 1), gw.output()
    p.write_text(text.format(url=u0.url))
    assert wait_for(lambda: [r["url"] for r in replicas()] == [f"{u0.url}/v1"]), gw.output()
    assert slow.is_alive() and _connections_to(u1.port) >= 1, "the edit cut the request in flight"
    slow.join(10)
    assert answered == [200]
    assert wait_for(lambda: _connections_to(u1.port) == 0), "the dropped replica's connection pool is still open"
    assert gw.post("/v1/chat/completions", json=body).status_code == 200


def test_several_policies_are_several_virtual_models(tmp_path, stk):
    u = stk.upstream("u")
    for name in ("alpha", "beta"):
        (tmp_path / f"{name}.yaml").write_text(
            f"version: 1\npools:\n  {name}-pool: {{model: m-{name}, replicas: [{{url: {u.url}/v1}}]}}\n"
            f"routes:\n  - {{name: r, pool: {name}-pool}}\n")
    gw = stk.gateway([tmp_path])  # a folder: every *.yaml in it
    ids = {m["id"] for m in gw.get("/v1/models").json()["data"]}
    assert {"alpha", "beta", "auto", "alpha-pool", "beta-pool", "m-alpha", "m-beta"} <= ids
    r = gw.post("/v1/chat/completions", json={"model": "beta", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200 and r.json()["model"] == "m-beta"


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "switchyard.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, input=stdin, timeout=60)


def invoke(*args: str):
    """The same typer app in process (a real `switchyard` process costs seconds of imports a run)."""
    from typer.testing import CliRunner

    from switchyard.cli import app

    return CliRunner().invoke(app, list(args))


def test_policy_check_explain_schema_cli(tmp_path):
    ok = run_cli("policy", "check", "policies/example.yaml")  # the real command, once
    assert ok.returncode == 0 and "ok" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "routes:\n  - {name: a, pool: nowhere}\n")
    r = invoke("policy", "check", str(bad), str(ROOT / "policies/example.yaml"))
    assert r.exit_code == 1 and f"{bad}:6:" in r.stderr and "unknown pool 'nowhere'" in r.stderr
    req = tmp_path / "req.json"
    req.write_text(orjson.dumps(chat("step by step, please", tools=9)).decode())
    r = invoke("policy", "explain", str(ROOT / "policies/example.yaml"), "--request", str(req))
    assert r.exit_code == 0 and "MATCH  big-toolset" in r.stdout and '"pool": "large"' in r.stdout
    r = invoke("policy", "schema")
    schema = orjson.loads(r.stdout)
    assert "pools" in schema["properties"] and "routes" in schema["required"]
