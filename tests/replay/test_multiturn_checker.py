"""The sessions checker against BFCL's own (multi_turn_checker from the wheel, imported in this test
only): recorded sessions, served over HTTP by the ground-truth reference pool, and deliberately wrong
copies of them (a call dropped, an argument changed, a turn emptied or moved, calls it cannot read,
an unknown function, a session cut short). The verdicts must agree on every one."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from multiturn_helpers import BfclChecker

from switchyard.datasets import bfcl_zip
from switchyard.replay.bfcl import default_data
from switchyard.replay.gateway import free_port
from switchyard.replay.multiturn.checker import score
from switchyard.replay.multiturn.data import CATEGORIES, SessionCase, load_sessions
from switchyard.replay.multiturn.reference import build_app
from switchyard.replay.multiturn.session import SessionClient, SessionRecord, Step, decode

PER_CATEGORY = 6


def _set(step: Step, response: list[dict[str, str]] | str) -> None:
    step.response = response
    if isinstance(response, str):
        step.calls = None
        return
    _, step.calls = decode({"tool_calls": [{"function": {"name": n, "arguments": a}}
                                            for c in response for n, a in c.items()]})


def _wrong(rec: SessionRecord, rng: random.Random) -> list[tuple[str, SessionRecord]]:
    """Copies of a recorded session, each wrong in one way (some still pass: BFCL decides)."""
    out = []
    steps = [(k, i) for k, t in enumerate(rec.turns) for i, s in enumerate(t.steps) if isinstance(s.response, list)]
    if not steps:
        return out
    k, i = rng.choice(steps)

    def copy_() -> tuple[SessionRecord, Step]:
        r = copy.deepcopy(rec)
        return r, r.turns[k].steps[i]

    r, s = copy_()
    _set(s, s.response[:-1] or "I would rather not.")
    out.append(("drop a call", r))
    r, s = copy_()
    resp = copy.deepcopy(s.response)
    name, args = next(iter(resp[-1].items()))
    a = json.loads(args)
    key = next((x for x, v in a.items() if isinstance(v, str)), None)
    if key is not None:
        a[key] = a[key] + "_x"
    else:
        a["unexpected"] = 1
    resp[-1] = {name: json.dumps(a)}
    _set(s, resp)
    out.append(("change an argument", r))
    r, s = copy_()
    _set(s, s.response + [{"rm": json.dumps({"file_name": "nothing.txt"})}, {"no_such_tool": "{}"}])
    out.append(("extra calls", r))
    r, s = copy_()
    _set(s, [{n: a + "}" for c in s.response for n, a in c.items()}])
    out.append(("unreadable arguments", r))
    r, _ = copy_()
    r.turns[k].steps = [Step(http_status=200, response="Done.")]
    out.append(("empty turn", r))
    if k > 0:
        r, _ = copy_()
        r.turns[k - 1].steps = r.turns[k].steps[:-1] + r.turns[k - 1].steps
        r.turns[k].steps = [Step(http_status=200, response="Done already.")]
        out.append(("turn's calls a turn early", r))
    r, _ = copy_()
    r.turns = r.turns[:k + 1]
    r.force_quit = True
    out.append(("cut short", r))
    return out


async def _record(cases: list[SessionCase]) -> list[SessionRecord]:
    runner = web.AppRunner(build_app(cases))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        client = SessionClient(f"http://127.0.0.1:{port}", "large")
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            return [await client.run(http, c, f"agreement/{c.id}") for c in cases]
    finally:
        await runner.cleanup()


@pytest.fixture(scope="module")
def bfcl(tmp_path_factory: pytest.TempPathFactory) -> BfclChecker:
    return BfclChecker(bfcl_zip(), tmp_path_factory.mktemp("bfcl_wheel"))


def test_checker_agrees_with_bfcl_on_recorded_and_wrong_sessions(bfcl: BfclChecker, tmp_path: Path) -> None:
    data = default_data()
    rng = random.Random(33)
    cases, entries = [], {}
    for cat in CATEGORIES:
        got = load_sessions(cat, data)
        cases += rng.sample(got, PER_CATEGORY)
        entries.update({e["id"]: e for e in data.entries(cat)[0]})
    records = asyncio.run(_record(cases))
    by_id = {c.id: c for c in cases}
    checked, kinds = 0, {True: 0, False: 0}
    failures = set()
    for rec in records:
        for what, r in [("as recorded", rec), *_wrong(rec, rng)]:
            r = SessionRecord.from_json(json.loads(json.dumps(r.to_json())))  # as a saved record reads back
            case = by_id[r.id]
            ours = score(case, r)
            theirs = bfcl.verdict(entries[r.id], case.ground_truth, r)
            assert ours.valid == theirs["valid"], (r.id, what, ours, theirs.get("error_type"))
            if not ours.valid:
                assert ours.error_type == theirs["error_type"], (r.id, what, ours, theirs)
                failures.add(ours.error_type)
            if what == "as recorded":
                assert ours.valid and all(ours.turns), (r.id, ours)  # the reference pool's upper bound
            checked += 1
            kinds[ours.valid] += 1
    # Both verdicts occur among the wrong copies, and every kind of failure BFCL names.
    assert kinds[True] > len(records) and kinds[False] > 3 * len(records), kinds
    assert failures >= {"multi_turn:instance_state_mismatch", "multi_turn:execution_response_mismatch",
                        "multi_turn:empty_turn_model_response", "multi_turn:force_terminated"}, failures
    print(f"{checked} sessions, {kinds[True]} pass, {kinds[False]} fail: verdicts and failure kinds agree")


def test_reference_pool_refuses_what_it_cannot_place() -> None:
    case = load_sessions("multi_turn_base", limit=1)[0]

    async def go() -> list[httpx.Response]:
        runner = web.AppRunner(build_app([case]))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        turn0 = {"messages": case.turn_messages(0), "user": f"x/{case.id}"}
        try:
            async with httpx.AsyncClient(trust_env=False) as http:
                return [await http.post(url, json=b) for b in (
                    turn0,
                    {**turn0, "user": "x/multi_turn_base_999"},
                    {**turn0, "stream": True},
                    {"messages": [m for k in range(6) for m in case.turn_messages(0)
                                  + [{"role": "assistant", "content": "ok"}]], "user": f"x/{case.id}"},
                    {"messages": "nope"},
                )] + [await http.post(url, content=b"{", headers={"content-type": "application/json"})]
        finally:
            await runner.cleanup()

    ok, unknown, stream, too_far, bad, not_json = asyncio.run(go())
    msg = ok.json()["choices"][0]["message"]
    assert ok.status_code == 200 and ok.json()["model"] == "reference (upper bound)"
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["cd", "mkdir", "mv"]
    for r, code in ((unknown, "unknown_case"), (stream, "unsupported"), (too_far, "unknown_turn"), (bad, None),
                    (not_json, None)):
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == code and err["type"] == "invalid_request_error", r.text
