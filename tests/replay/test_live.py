"""Live replay through a real `switchyard serve` process to real upstream server processes.

Two upstreams answer with the cases' ground truth; the "small" one leaves out the call on
one case in three. The policy sends cases with several tools to the large pool.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from replay_helpers import policy_file
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.replay.bfcl import load_category
from switchyard.replay.gateway import GatewayProcess, free_port
from switchyard.replay.suite import load_suite

runner = CliRunner()


def _cases() -> list:
    # 14 suite cases: every standard and hard category is represented.
    suite = load_suite("tooluse-92")
    seen: dict[str, int] = {}
    out = []
    for c in suite:
        if seen.get(c.category, 0) < 2:
            seen[c.category] = seen.get(c.category, 0) + 1
            out.append(c)
    return out


def _replay(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, ["replay", *args])
    return res.exit_code, res.output + (str(res.exception) if res.exception and res.exit_code not in (0, 1, 2) else "")


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


@pytest.fixture
def setup(tmp_path: Path, upstream):
    cases = _cases()
    known = cases + load_category("simple_python", limit=3)
    small = upstream(known, wrong_every=3)
    large = upstream(known, wrong_every=0)
    pol = policy_file(tmp_path / "routed.yaml", small, large)
    return cases, pol


@pytest.mark.slow  # a replay run against a real gateway process
def test_live_through_gateway_and_counterfactual_matches(setup, tmp_path: Path) -> None:
    cases, pol = setup
    ids = [c.id for c in cases]
    trace = tmp_path / "cases.jsonl"
    # The same cases as a BFCL-id list would be: write them as a JSONL trace (tool names are
    # already legal OpenAI names in the trace, so expected answers use those names).
    from switchyard.replay.scoring import ground_truth_calls

    with trace.open("w", encoding="utf-8") as f:
        for c in cases:
            legal = {o: n for n, o in c.name_map.items()}
            exp = [{legal.get(k, k): v for k, v in call.items()} for call in (c.expected or [])]
            f.write(json.dumps({"id": c.id, "category": c.category, **c.body,
                                "expected": exp if c.kind == "ast" else []}) + "\n")
            assert ground_truth_calls(c) is not None
    outcomes = tmp_path / "outcomes.jsonl"
    recorded = tmp_path / "recorded.jsonl"
    with GatewayProcess(pol, extra_args=["--record", str(recorded)]) as gw:
        for pool in ("small", "large"):
            code, text = _replay(str(trace), "--gateway", gw.url, "--pool", pool, "--outcomes", str(outcomes),
                                 "--out", str(tmp_path / pool))
            assert code == 0, text
        code, text = _replay(str(trace), "--gateway", gw.url, "-p", str(pol), "--out", str(tmp_path / "live"))
        assert code == 0, text
    large = _report(tmp_path / "large")["runs"][0]
    small = _report(tmp_path / "small")["runs"][0]
    live = _report(tmp_path / "live")["runs"][0]
    assert large["totals"]["score"] == 100.0  # ground truth everywhere
    assert small["totals"]["score"] < 100.0  # one case in three without its call
    assert {c["pool"] for c in large["cases"]} == {"large"}
    # The routed run read the gateway's headers: pool and rule per case.
    assert [c["id"] for c in live["cases"]] == ids
    for c in live["cases"]:
        assert c["rule"] in ("several-tools", "default") and c["pool"] in ("small", "large")
        assert c["latency_ms"] > 0 and c["prompt_tokens"] > 0
    t = live["totals"]
    assert t["cases"] == len(ids) == sum(t["split"].values())
    assert t["correct"] == sum(c["correct"] for c in live["cases"])
    # Counterfactual from the two forced-pool runs: same routes, same score.
    code, text = _replay("--from-outcomes", str(outcomes), "-p", str(pol), "--out", str(tmp_path / "cf"))
    assert code == 0, text
    cf = _report(tmp_path / "cf")["runs"][0]
    assert cf["totals"]["score"] == t["score"]
    assert [(c["id"], c["pool"], c["correct"]) for c in cf["cases"]] == [
        (c["id"], c["pool"], c["correct"]) for c in live["cases"]
    ]
    # `serve --record` wrote every request (3 runs) as a trace that replays against a policy.
    code, text = _replay(str(recorded), "--dry-run", "-p", str(pol), "--out", str(tmp_path / "rec"))
    assert code == 0, text
    rec = _report(tmp_path / "rec")["runs"][0]
    assert rec["totals"]["cases"] == 3 * len(ids)
    assert rec["totals"]["split"] == {p: 3 * n for p, n in t["split"].items()}
    html = (tmp_path / "live" / "report.html").read_text()
    for png in ("quality_vs_large_share.png", "split.png", "latency.png"):
        assert png in html and (tmp_path / "live" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # a replay run against a real gateway process
def test_gateway_started_from_policy_and_bfcl_source(setup, tmp_path: Path) -> None:
    # No --gateway: replay starts `switchyard serve --policy` itself and stops it.
    _, pol = setup
    code, text = _replay("bfcl:simple_python:3", "-p", str(pol), "--out", str(tmp_path / "o"))
    assert code == 0, text
    rep = _report(tmp_path / "o")["runs"][0]
    assert [c["id"] for c in rep["cases"]] == ["simple_python_0", "simple_python_1", "simple_python_2"]
    assert {c["pool"] for c in rep["cases"]} == {"small"} and {c["rule"] for c in rep["cases"]} == {"default"}
    assert rep["totals"]["correct"] == sum(c["correct"] for c in rep["cases"]) and rep["totals"]["scored"] == 3


def test_unreachable_gateway_keeps_partial_results(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    outcomes = tmp_path / "outcomes.jsonl"
    code, text = _replay("bfcl:simple_python:5", "--gateway", url, "--retries", "1", "--out", str(tmp_path / "o"),
                         "--pool", "small", "--outcomes", str(outcomes))
    assert code == 1
    assert "unreachable" in text and "cannot connect" in text
    rep = _report(tmp_path / "o")["runs"][0]
    assert len(rep["cases"]) == 5
    assert {c["status"] for c in rep["cases"]} <= {"error", "skipped"}
    assert rep["totals"]["aborted"]
    assert not outcomes.exists() or outcomes.read_text() == ""  # an outage is not a wrong answer


@pytest.mark.slow  # a replay run against a real gateway process
def test_retries_counted_and_timeouts(tmp_path: Path, upstream) -> None:
    # Straight at an OpenAI-compatible server (no gateway): the first 3 answers are 503.
    cases = load_category("simple_python", limit=4)
    flaky = upstream(cases, fail_first=3)
    code, text = _replay("bfcl:simple_python:4", "--gateway", flaky, "--pool", "small", "--concurrency", "1",
                         "--retries", "3", "--out", str(tmp_path / "r"))
    assert code == 0, text
    rep = _report(tmp_path / "r")["runs"][0]
    assert rep["totals"]["retries"] == 3 and rep["totals"]["score"] == 100.0
    slow = upstream(cases, delay=1.0)
    code, text = _replay("bfcl:simple_python:2", "--gateway", slow, "--timeout", "0.3", "--retries", "0",
                         "--out", str(tmp_path / "t"))
    assert code == 0, text
    rep = _report(tmp_path / "t")["runs"][0]
    assert all(c["status"] == "error" and "timed out" in c["error"] for c in rep["cases"])
    assert rep["totals"]["errors"] == 2 and rep["totals"]["score"] == 0.0


def test_outcomes_keep_refusals_and_leave_out_outages(tmp_path: Path, upstream) -> None:
    # The upstream knows 4 of 6 cases and answers the other two with a 400 (as an engine refuses a
    # prompt past its context): the pool fails those. A slow upstream's timeouts are no answer.
    known = upstream(load_category("simple_python", limit=4))
    outcomes = tmp_path / "o.jsonl"
    code, text = _replay("bfcl:simple_python:6", "--gateway", known, "--pool", "small", "--outcomes", str(outcomes))
    assert code == 0, text
    lines = {x["id"]: x for x in map(json.loads, outcomes.read_text().splitlines())}
    assert len(lines) == 6 and [lines[f"simple_python_{k}"]["correct"] for k in range(6)] == [True] * 4 + [False] * 2
    assert lines["simple_python_5"]["http_status"] == 400 and lines["simple_python_5"]["status"] == "error"
    slow = upstream(load_category("simple_python", limit=2), delay=1.0)
    code, text = _replay("bfcl:simple_python:2", "--gateway", slow, "--pool", "small", "--timeout", "0.3",
                         "--retries", "0", "--outcomes", str(tmp_path / "t.jsonl"))
    assert code == 0, text
    assert not (tmp_path / "t.jsonl").exists() or (tmp_path / "t.jsonl").read_text() == ""


@pytest.mark.slow  # a replay run against a real gateway process
def test_sigterm_keeps_partial_results(tmp_path: Path, upstream) -> None:
    cases = load_category("simple_python", limit=20)
    slow = upstream(cases, delay=1.0)
    out = tmp_path / "o"
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchyard.cli", "replay", "bfcl:simple_python:20", "--gateway", slow,
         "--concurrency", "1", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        time.sleep(4.0)
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, text
    assert "interrupted by SIGTERM" in text
    rep = _report(out)["runs"][0]
    statuses = [c["status"] for c in rep["cases"]]
    assert len(statuses) == 20 and set(statuses) <= {"ok", "skipped"} and "skipped" in statuses
    assert rep["totals"]["correct"] == statuses.count("ok")  # answered cases are all right


def test_forced_tool_choice_goes_with_cases_that_have_tools() -> None:
    """--tool-choice required: sent with every case that has tools, never with one that has none
    (an engine answers tool_choice without tools with a 400)."""
    import asyncio

    import httpx

    from switchyard.replay.cases import Case
    from switchyard.replay.live import LiveClient

    sent: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "ok"}}]})

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    cases = [Case("a", "simple", {"messages": [{"role": "user", "content": "hi"}], "tools": tools}, kind="none"),
             Case("b", "simple", {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"},
                  kind="none")]
    client = LiveClient("http://replay.test", extra_body={"tool_choice": "required"})

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as c:
            for case in cases:
                await client.send(c, case, "m", None)

    asyncio.run(go())
    assert sent[0]["tool_choice"] == "required" and "tool_choice" not in sent[1]
    code, out = _replay("tooluse-92", "--gateway", "http://127.0.0.1:9", "--tool-choice", "sometimes")
    assert code == 2 and "--tool-choice must be auto, required or none" in out
