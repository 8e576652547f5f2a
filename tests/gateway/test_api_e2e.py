"""The gateway as a client sees it: the official OpenAI SDK against a gateway on loopback.

Every test runs twice under `make test`: against gwkit's cluster in process (tests/gateway/inproc.py,
the app served by uvicorn in this process) and against real processes (slow; `make test-fast` skips it)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import inproc
import openai
import orjson
import pytest
from gwkit import Cluster, make_cluster, stop_cluster
from procs import http_get, http_post


@pytest.fixture(scope="module", params=["inproc", pytest.param("process", marks=pytest.mark.slow)])
def cluster(request, tmp_path_factory) -> Iterator[Cluster]:
    """Overrides gwkit's (which `fresh` resets before each test)."""
    tmp = tmp_path_factory.mktemp("cluster")
    if request.param == "process":
        c = make_cluster(tmp)
        yield c
        stop_cluster(c)
        return
    with inproc.stack() as s:
        yield inproc.make_cluster(s, tmp)


def client(c, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=c.url + "/v1", api_key="unused", max_retries=0, **kw)


def test_models_lists_policies_pools_and_upstream_ids(fresh):
    ids = {m.id for m in client(fresh).models.list()}
    assert {"test", "auto", "small", "large", "small-model", "large-model"} <= ids


def test_chat_routes_and_rewrites_only_the_model(fresh):
    c = client(fresh)
    raw = c.chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": "hello"}],
        n=2, stop=["x"], response_format={"type": "text"},
        extra_body={"my_vendor_field": {"a": [1, 2.5, None]}, "top_k": 3},
    )
    resp = raw.parse()
    assert raw.headers["x-switchyard-pool"] == "small"
    assert raw.headers["x-switchyard-rule"] == "default"
    assert raw.headers["x-switchyard-label"] == "none"
    assert raw.headers["x-switchyard-replica"] in ("s0", "s1")
    assert float(raw.headers["x-switchyard-overhead-ms"]) >= 0
    assert len(resp.choices) == 2
    seen = fresh.upstream_state(raw.headers["x-switchyard-replica"])["last_body"]
    assert seen["model"] == "small-model"
    assert seen["my_vendor_field"] == {"a": [1, 2.5, None]}
    assert seen["top_k"] == 3 and seen["n"] == 2 and seen["stop"] == ["x"]
    assert seen["response_format"] == {"type": "text"}


def test_stream_is_relayed_chunk_by_chunk(fresh):
    fresh.control("s0", chunk_delay_ms=150)
    fresh.control("s1", chunk_delay_ms=150)
    c = client(fresh)
    t0 = time.perf_counter()
    arrivals, text = [], ""
    with c.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}], stream=True) as s:
        for chunk in s:
            arrivals.append(time.perf_counter() - t0)
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
    assert text == "tok0 tok1 tok2 tok3 tok4 "
    # Chunks arrive as the upstream sends them (150 ms apart), not all at once at the end.
    assert arrivals[0] < 0.5 and arrivals[-1] - arrivals[0] > 0.5


def test_tool_calls_pass_through(fresh):
    for name in ("s0", "s1"):
        fresh.control(name, tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    r = client(fresh).chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "weather in Paris?"}], tools=tools, tool_choice="auto"
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_completions_endpoint(fresh):
    r = client(fresh).completions.create(model="small", prompt="say hi")
    assert "say hi" in r.choices[0].text


def test_route_endpoint_explains_without_sending(fresh):
    before = sum(fresh.upstream_state(n)["served"] for n in ("s0", "s1", "l0"))
    body = {"model": "auto", "messages": [{"role": "user", "content": "a hard problem"}]}
    status, raw = http_post(fresh.url + "/v1/route", orjson.dumps(body))
    d = orjson.loads(raw)
    assert status == 200 and d["pool"] == "large" and d["rule"] == "keyword"
    assert "hard problem" in d["reason"]
    after = sum(fresh.upstream_state(n)["served"] for n in ("s0", "s1", "l0"))
    assert after == before


def test_errors_are_typed_sdk_exceptions(fresh):
    c = client(fresh)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="auto", messages=[])
    assert e.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="auto", messages=[{"role": "wizard", "content": "x"}])


@pytest.mark.parametrize(
    "body,status,param",
    [
        (b"{not json", 400, None),
        (b"", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
        (b'{"model": "auto"}', 400, "messages"),
        (b'{"model": "auto", "messages": "hello"}', 400, "messages"),
        (b'{"model": "auto", "messages": [42]}', 400, "messages[0]"),
        (b'{"model": "auto", "messages": [{"role": "user", "content": 5}]}', 400, "messages[0].content"),
        (b'{"model": "auto", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}', 400, "stream"),
        (b'{"model": "ghost", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    ],
)
def test_bad_input_gets_openai_error_envelope(fresh, body, status, param):
    code, raw = http_post(fresh.url + "/v1/chat/completions", body)
    err = orjson.loads(raw)["error"]
    assert code == status
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param


def test_body_over_limit_is_413(fresh):
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(fresh.url)
    with socket.create_connection((u.hostname, u.port), timeout=5) as s:
        # The announced size alone is refused, before the 17 MB would be read.
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n{" % (17 * 1024 * 1024))
        head = ""
        while '"request_too_large"' not in head:  # headers and body may come in separate packets
            part = s.recv(65536).decode()
            if not part:
                break
            head += part
    assert head.startswith("HTTP/1.1 413")
    assert '"request_too_large"' in head


def test_unknown_path_and_method(fresh):
    code, raw = http_get(fresh.url + "/v1/nothing")
    assert code == 404 and "error" in orjson.loads(raw)
    code, raw = http_get(fresh.url + "/v1/chat/completions")
    assert code == 405 and orjson.loads(raw)["error"]["code"] == "method_not_allowed"


def test_health_and_metrics(fresh):
    client(fresh).chat.completions.create(model="auto", messages=[{"role": "user", "content": "count me"}])
    code, raw = http_get(fresh.url + "/health")
    h = orjson.loads(raw)
    assert code == 200
    pools = h["policies"]["test"]["pools"]
    assert {r["name"] for r in pools["small"]["replicas"]} == {"s0", "s1"}
    assert all(r["state"] == "healthy" for r in pools["small"]["replicas"])
    with urllib.request.urlopen(fresh.url + "/metrics") as r:
        text = r.read().decode()
    for name in ("switchyard_requests_total", "switchyard_request_seconds_bucket", "switchyard_overhead_seconds_bucket",
                 "switchyard_inflight", "switchyard_circuit_state", "switchyard_retries_total"):
        assert name in text or name.replace("_total", "") in text
    assert 'rule="default"' in text and 'pool="small"' in text
