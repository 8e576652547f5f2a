"""The LLM classifier against real HTTP servers: a label server, a dead port, a slow pool, errors."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from procs import Proc, free_port, http_get

from switchyard.classify.features import extract
from switchyard.classify.llm import CallPool, LLMClassifier
from switchyard.policy.classifier import build_classifier
from switchyard.policy.loader import parse_policy
from switchyard.policy.rules import compile_policy
from switchyard.policy.schema import ClassifierSpec

HERE = Path(__file__).parent
BODY = {
    "model": "auto",
    "messages": [{"role": "user", "content": "Book flights to Rome and Oslo, then email both itineraries."}],
    "tools": [{"type": "function", "function": {"name": "book_flight", "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "send_email", "parameters": {"type": "object"}}}],
}
FEATURES = extract(BODY)


def pool_caller(urls: dict[str, str]) -> tuple[CallPool, list[dict]]:
    """A call_pool like the gateway's: POST the chat body to the pool's server, return its JSON."""
    sent: list[dict] = []

    async def call(pool: str, body: dict, timeout: float) -> dict:
        sent.append(body)
        async with httpx.AsyncClient(timeout=timeout) as client:
            r = await client.post(f"{urls[pool]}/v1/chat/completions", json=body)
            r.raise_for_status()
            return r.json()

    return call, sent


@pytest.fixture
def label_server(tmp_path: Path) -> Iterator[callable]:
    procs: list[Proc] = []

    def start(mode: str = "label", delay: float = 0.0) -> str:
        port = free_port()
        p = Proc([sys.executable, str(HERE / "label_server.py"), "--port", str(port), "--mode", mode,
                  "--delay", str(delay)], f"http://127.0.0.1:{port}/health", tmp_path / f"label-{port}.log")
        procs.append(p)
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.stop()


def llm(call: CallPool, timeout: float = 0.2, **kw: object) -> LLMClassifier:
    spec = ClassifierSpec(kind="llm", pool="small", timeout=timeout, on_failure="complex")
    clf = build_classifier(spec, Path("."), call)
    assert isinstance(clf, LLMClassifier)
    for k, v in kw.items():
        setattr(clf, k, v)
    return clf


async def test_label_and_confidence_from_logprobs(label_server) -> None:
    call, sent = pool_caller({"small": label_server("label")})
    clf = llm(call, timeout=2.0)
    lab = await clf.classify(FEATURES, BODY)
    # The server puts 0.5 + 0.2 on complex tokens, 0.2 on simple, 0.1 elsewhere: 0.7 / 0.9.
    assert (lab.name, lab.kind) == ("complex", "llm")
    assert lab.confidence == pytest.approx(0.7 / 0.9, abs=1e-6)
    assert clf.ok_count == 1 and clf.fail_open_count == 0
    req = sent[0]
    assert req["max_tokens"] == 1 and req["logprobs"] is True and req["top_logprobs"] >= 2
    assert "simple, complex" in req["messages"][0]["content"]
    assert "Book flights to Rome" in req["messages"][1]["content"]


async def test_word_without_logprobs_and_unparseable_answer(label_server) -> None:
    call, _ = pool_caller({"small": label_server("nologprobs"), "bad": label_server("garbage")})
    clf = llm(call, timeout=2.0)
    lab = await clf.classify(FEATURES, BODY)
    assert (lab.name, lab.confidence, lab.kind) == ("simple", 1.0, "llm")
    clf.pool = "bad"
    lab = await clf.classify(FEATURES, BODY)
    assert (lab.name, lab.kind) == ("complex", "fail-open")
    assert clf.error_count == 1 and "banana" in (clf.last_error or "")


async def test_dead_port_fails_open_within_budget() -> None:
    call, _ = pool_caller({"small": f"http://127.0.0.1:{free_port()}"})
    clf = llm(call, timeout=0.2)
    t0 = time.perf_counter()
    lab = await clf.classify(FEATURES, BODY)
    elapsed = time.perf_counter() - t0
    assert (lab.name, lab.kind, lab.confidence) == ("complex", "fail-open", 1.0)
    assert elapsed < 0.2 + 0.15
    assert clf.fail_open_count == 1 and clf.error_count == 1
    assert "Connect" in (clf.last_error or "")
    # A fail-open label is a firm decision: a confidence-gated rule still sends it to the large pool.
    policy = compile_policy(parse_policy(
        "version: 1\npools:\n  small: {model: s, replicas: [{url: 'http://127.0.0.1:9/v1'}]}\n"
        "  large: {model: l, replicas: [{url: 'http://127.0.0.1:10/v1'}]}\nroutes:\n"
        "  - {name: hard, when: {label: complex, confidence: '>= 0.6'}, pool: large}\n"
        "  - {name: default, pool: small}\n"
    ))
    assert policy.evaluate(FEATURES, lab)[0].pool == "large"


async def test_slow_pool_fails_open_at_the_budget_then_breaker_skips(label_server) -> None:
    url = label_server("label", delay=2.0)
    call, _ = pool_caller({"small": url})
    clf = llm(call, timeout=0.15, breaker_failures=3, breaker_cooldown=30.0)
    for _ in range(3):
        t0 = time.perf_counter()
        lab = await clf.classify(FEATURES, BODY)
        elapsed = time.perf_counter() - t0
        assert lab.kind == "fail-open" and lab.name == "complex"
        # At the budget, not the slow pool's 2 s: slack for a loaded 2-core CI machine (one call took 0.81 s there
        # while the other test worker started processes).
        assert 0.14 <= elapsed < 1.0
    assert clf.timeout_count == 3 and clf.breaker_open
    # Breaker open: no call is made at all, the answer is instant.
    t0 = time.perf_counter()
    lab = await clf.classify(FEATURES, BODY)
    assert lab.kind == "fail-open" and time.perf_counter() - t0 < 0.01
    assert clf.skipped_count == 1 and clf.fail_open_count == 4
    _, data = http_get(f"{url}/calls")
    assert json.loads(data)["calls"] == 3


async def test_breaker_trial_after_cooldown_closes_it(label_server) -> None:
    good = label_server("label")
    urls = {"small": f"http://127.0.0.1:{free_port()}"}
    call, _ = pool_caller(urls)
    clf = llm(call, timeout=0.5, breaker_failures=2, breaker_cooldown=0.2)
    for _ in range(2):
        assert (await clf.classify(FEATURES, BODY)).kind == "fail-open"
    assert clf.breaker_open
    urls["small"] = good  # the pool comes back
    assert (await clf.classify(FEATURES, BODY)).kind == "fail-open"  # still cooling down: skipped
    await asyncio.sleep(0.25)
    lab = await clf.classify(FEATURES, BODY)  # the trial call
    assert lab.kind == "llm" and not clf.breaker_open and clf.consecutive_failures == 0


async def test_http_error_fails_open(label_server) -> None:
    call, _ = pool_caller({"small": label_server("error")})
    clf = llm(call, timeout=1.0)
    lab = await clf.classify(FEATURES, BODY)
    assert lab.kind == "fail-open" and clf.error_count == 1 and "500" in (clf.last_error or "")


async def test_real_engine_serving_smollm2_gives_a_label(smollm2_server) -> None:
    """Our engine serving SmolLM2 (the session's shared server, tests/conftest.py: `engine` by its fixture)."""
    call, sent = pool_caller({"small": smollm2_server.url})
    clf = llm(call, timeout=30.0)  # the budget is generous here: this test is about the answer
    lab = await clf.classify(FEATURES, BODY)
    assert lab.kind == "llm", f"failed open: {clf.last_error}\n{smollm2_server.output()}"
    assert lab.name in ("simple", "complex")
    assert 0.0 < lab.confidence <= 1.0
    assert sent[0]["max_tokens"] == 1
