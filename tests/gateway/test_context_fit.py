"""Context windows (issue 27, item 7): a request goes only where its prompt fits, max_tokens is
lowered to what the window leaves, and a prompt too long for every pool gets the API's own error
at once. Real gateway process, fake upstreams that report their window in /v1/models as vLLM does."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from procs import Proc, http_get, http_post, start_gateway, start_upstream

from switchyard.pools import fit

POLICY = """
version: 1
name: ctx
pools:
  small:
    model: small-model
    health: {{interval: 0.3s, timeout: 1s}}
    replicas: [{{url: {short}/v1, name: short}}]
  big:
    model: big-model
    health: {{interval: 0.3s, timeout: 1s}}
    replicas: [{{url: {long}/v1, name: long}}]
  fixed:
    model: fixed-model
    max_model_len: 1024
    health: {{interval: 0.3s, timeout: 1s}}
    replicas: [{{url: {silent}/v1, name: silent}}]
routes:
  - name: default
    pool: small
fallback:
  small: [big]
"""

SHORT, LONG = 2048, 32768


class Ctx:
    def __init__(self, tmp: Path, ups: dict[str, tuple[Proc, str]], gw: Proc, url: str):
        self.tmp, self.ups, self.gw, self.url = tmp, ups, gw, url

    def served(self, name: str) -> int:
        return orjson.loads(http_get(self.ups[name][1] + "/_state")[1])["served"]

    def last_body(self, name: str) -> dict:
        return orjson.loads(http_get(self.ups[name][1] + "/_state")[1])["last_body"]

    def post(self, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict, dict]:
        import urllib.request

        req = urllib.request.Request(self.url + path, data=orjson.dumps(body),
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, dict(r.headers), orjson.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), orjson.loads(e.read())


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctx]:
    tmp = tmp_path_factory.mktemp("ctx")
    ups = {"short": start_upstream(tmp, "short", None, "--max-model-len", str(SHORT)),
           "long": start_upstream(tmp, "long", None, "--max-model-len", str(LONG)),
           "silent": start_upstream(tmp, "silent")}
    policy = tmp / "ctx.yaml"
    policy.write_text(POLICY.format(**{k: u for k, (_, u) in ups.items()}))
    gw, url = start_gateway(tmp, [policy])
    try:
        deadline = time.time() + 10
        while True:  # the first health round reads the windows
            reps = {r["name"]: r for p in orjson.loads(http_get(url + "/health")[1])["policies"]["ctx"]["pools"]
                    .values() for r in p["replicas"]}
            if "max_model_len" in reps["short"] and "max_model_len" in reps["long"]:
                break
            assert time.time() < deadline, f"windows not discovered: {reps}"
            time.sleep(0.1)
        assert reps["short"]["max_model_len"] == {"fake": SHORT}
        assert "max_model_len" not in reps["silent"]  # it reports none: the policy's field decides
        yield Ctx(tmp, ups, gw, url)
    finally:
        gw.stop()
        for p, _ in ups.values():
            p.stop()


def chat(text: str, **extra) -> dict:
    return {"model": "auto", "messages": [{"role": "user", "content": text}], **extra}


def test_fits_the_routed_pool_and_max_tokens_is_clamped(ctx: Ctx) -> None:
    body = chat("hello there", max_tokens=32000)
    status, headers, answer = ctx.post("/v1/chat/completions", body)
    assert status == 200, answer
    assert headers["x-switchyard-pool"] == "small"
    sent = ctx.last_body("short")["max_tokens"]
    assert sent == SHORT - fit.estimate(body)  # what the window leaves
    assert 1900 < sent < SHORT


def test_every_budget_field_is_clamped_and_small_ones_kept(ctx: Ctx) -> None:
    status, _, _ = ctx.post("/v1/chat/completions", chat("hi", max_completion_tokens=10**6))
    assert status == 200
    assert ctx.last_body("short")["max_completion_tokens"] < SHORT
    status, _, _ = ctx.post("/v1/chat/completions", chat("hi", max_tokens=7))
    assert status == 200
    assert ctx.last_body("short")["max_tokens"] == 7  # a cap under the window is the client's own


def test_too_long_for_the_routed_pool_goes_where_it_fits(ctx: Ctx) -> None:
    before_short, before_long = ctx.served("short"), ctx.served("long")
    text = "word " * 2400  # ~12 KB: ~3,300 tokens with the margin, more than 2,048
    status, headers, answer = ctx.post("/v1/chat/completions", chat(text, max_tokens=32000))
    assert status == 200, answer
    assert headers["x-switchyard-pool"] == "big"
    assert headers["x-switchyard-fallback-from"] == "small"
    assert ctx.served("short") == before_short  # never sent where it cannot fit
    assert ctx.served("long") == before_long + 1
    assert ctx.last_body("long")["max_tokens"] < LONG - 3000


def test_too_long_for_every_pool_is_refused_at_once(ctx: Ctx) -> None:
    before = ctx.served("short") + ctx.served("long")
    text = "word " * 30000  # ~150 KB: ~41k tokens, more than either window
    t0 = time.perf_counter()
    status, _, answer = ctx.post("/v1/chat/completions", chat(text, stream=True))
    took = time.perf_counter() - t0
    assert status == 400
    assert took < 1.0
    err = answer["error"]
    assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert err["param"] == "messages"
    assert err["message"].startswith(f"This model's maximum context length is {LONG} tokens. However, your "
                                     "messages resulted in about ")
    assert ctx.served("short") + ctx.served("long") == before


def test_a_direct_pool_keeps_its_fallbacks_and_is_held_to_its_window(ctx: Ctx) -> None:
    status, headers, _ = ctx.post("/v1/chat/completions", {**chat("word " * 2400), "model": "small"})
    assert status == 200 and headers["x-switchyard-pool"] == "big"  # small's fallback, as when routed
    status, _, answer = ctx.post("/v1/chat/completions", {**chat("word " * 2400), "model": "fixed"})
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 1024 tokens" in answer["error"]["message"]


def test_the_policy_field_sets_a_window_the_upstream_does_not_report(ctx: Ctx) -> None:
    status, _, answer = ctx.post("/v1/chat/completions", {**chat("word " * 1000), "model": "fixed"})
    assert status == 400 and "maximum context length is 1024 tokens" in answer["error"]["message"]
    status, _, answer = ctx.post("/v1/chat/completions", {**chat("hi", max_tokens=5000), "model": "fixed"})
    assert status == 200, answer
    assert 900 < ctx.last_body("silent")["max_tokens"] < 1024


def test_anthropic_clients_read_prompt_is_too_long(ctx: Ctx) -> None:
    if http_post(ctx.url + "/v1/messages", b"{}")[0] == 404:
        pytest.skip("/v1/messages is not mounted in this tree")
    body = {"model": "auto", "max_tokens": 32000, "messages": [{"role": "user", "content": "word " * 30000}]}
    t0 = time.perf_counter()
    status, _, answer = ctx.post("/v1/messages", body, {"anthropic-version": "2023-06-01"})
    assert time.perf_counter() - t0 < 1.0
    assert status == 400, answer
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    msg = answer["error"]["message"]
    assert msg.startswith("prompt is too long: ") and msg.endswith(f" > {LONG - fit.MIN_COMPLETION} maximum"), msg
    # ... and one that fits goes through with its max_tokens (Claude Code's 32000) lowered
    status, _, answer = ctx.post("/v1/messages", {**body, "messages": [{"role": "user", "content": "hi"}]},
                                 {"anthropic-version": "2023-06-01"})
    assert status == 200, answer
    assert ctx.last_body("short")["max_tokens"] < SHORT


def test_windows_as_each_server_reports_them() -> None:
    vllm = {"object": "list", "data": [{"id": "meta-llama/Llama-3.1-8B", "object": "model", "max_model_len": 131072}]}
    assert fit.parse_windows(vllm) == {"meta-llama/Llama-3.1-8B": 131072}
    # llama-server: one slot's context (--ctx-size / --parallel), not the model's trained one
    cpp = {"data": [{"id": "smollm2", "meta": {"n_ctx": 2048, "n_ctx_train": 8192}}]}
    assert fit.parse_windows(cpp) == {"smollm2": 2048}
    older = {"data": [{"id": "smollm2", "meta": {"n_ctx_train": 8192}}]}
    assert fit.parse_windows(older, {"default_generation_settings": {"n_ctx": 4096}}) == {"smollm2": 4096}
    assert fit.parse_windows(older) == {"smollm2": 8192}
    assert fit.parse_windows({"data": [{"id": "x"}]}) == {}
    assert fit.parse_windows({"data": "nonsense"}) == {} and fit.parse_windows(None) == {}
