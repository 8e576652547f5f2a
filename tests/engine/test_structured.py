"""Constrained decoding through `switchyard engine serve` with the real SmolLM2 and the OpenAI
SDK: tool_choice required / named / auto, response_format, streamed calls, mixed batches, 400s;
an agent loop through the gateway, and the README's tour through the default policy. The pieces (masks, the call parser) are tested alone first."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from engine_support import (
    INT4_SERVER_ARGS,
    SCHEMAS,
    TOOLS,
    TRIP,
    WEATHER,
    EngineServer,
    get,
    smollm2_grammars,
)


@pytest.fixture(scope="module")
def server(server_int4: EngineServer) -> EngineServer:
    """One replica, as `switchyard up` runs it (conftest.server_int4: int4 weights on the native
    kernels where the CPU has them; each row's result is the same whatever batch it runs in)."""
    return server_int4


PROMPTS = ["What's the weather in Paris for the next 3 days?", "Book a business trip to Rome for Ann, 34.",
           "Is it going to rain in Tokyo this week? Use fahrenheit.", "Plan a trip to Oslo and Bergen for Tom (52).",
           "Weather in Lima tomorrow, please.", "I need economy seats to Cairo for Lea, age 8.",
           "How cold will Moscow be over 10 days?", "Book me, Sam, 41, to Lisbon, Porto and Faro.",
           "Forecast for Nairobi, 2 days, celsius.", "Send Max (29) to Berlin in business class.",
           "Will it be sunny in Sydney on the weekend?", "Trip for Eva, 67, to Vienna, economy."]
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
          "required": ["name", "age", "hobbies"]}


def _client(server: EngineServer) -> Any:
    from openai import OpenAI

    # Generous: on a 2-core machine shared with other test runs a step can take 20x its time.
    return OpenAI(base_url=server.url + "/v1", api_key="none", timeout=600, max_retries=0)


def _ask(server: EngineServer, prompt: str, **kw: Any) -> Any:
    kw = {"temperature": 0, "max_tokens": 120, **kw}
    return _client(server).chat.completions.create(model="smollm2-135m",
                                                   messages=[{"role": "user", "content": prompt}], **kw)


def _valid_calls(choice: Any, names: set[str] | None = None) -> list[tuple[str, dict]]:
    calls = choice.message.tool_calls or []
    out = []
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert names is None or c.function.name in names, c.function.name
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        out.append((c.function.name, args))
    return out


# -- the pieces, without a server ----------------------------------------------------------


def test_token_mask_native_equals_torch_and_spares_free_rows() -> None:
    from switchyard.engine.backends.cpu.native import load
    from switchyard.engine.backends.cpu.token_mask import apply_token_bitmask, apply_token_bitmask_torch

    g = torch.Generator().manual_seed(0)
    for V, W in ((49152, 1536), (1000, 32), (1030, 32)):  # the last: a vocabulary padded past the mask
        logits = torch.randn(5, V, generator=g)
        bitmask = torch.randint(-2**31, 2**31 - 1, (5, W), dtype=torch.int32, generator=g)
        bitmask[1] = -1  # every token allowed
        bitmask[3] = 0
        bitmask[3, 0] = 1 << 2  # only token 2
        rows = [0, 1, 3]
        a, b = logits.clone(), logits.clone()
        apply_token_bitmask(a, bitmask, rows)
        apply_token_bitmask_torch(b, bitmask, rows)
        assert torch.equal(a, b)
        n = min(V, 32 * W)
        assert torch.equal(a[[2, 4]], logits[[2, 4]])  # free rows untouched
        assert torch.equal(a[1, :n], logits[1, :n])  # all allowed ...
        assert torch.isinf(a[1, n:]).all()  # ... but the padding past the mask
        assert a[3].argmax() == 2 and torch.isinf(a[3]).sum() == V - 1
        bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        allowed = torch.cat([bits.flatten().bool(), torch.zeros(max(0, V - 32 * W), dtype=torch.bool)])[:V]
        assert torch.equal(torch.isinf(a[0]), ~allowed)
    assert load()[0] is None or load()[0].sy_token_mask  # the native build carries the kernel


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
def test_gpu_masks_equal_the_cpu_kernel() -> None:
    """The GPU path (torch ops on the device, the bitmask copied over) masks as the CPU kernel does,
    in float32 and bfloat16; a real grammar's masker leaves the free row alone on the GPU too."""
    from switchyard.engine.backends.cpu.token_mask import apply_token_bitmask
    from switchyard.engine.chat.grammar import GrammarMasker
    from switchyard.engine.chat.structured import constraint

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 49152, generator=g)
    bitmask = torch.randint(-2**31, 2**31 - 1, (4, 1536), dtype=torch.int32, generator=g)
    ref = logits.clone()
    apply_token_bitmask(ref, bitmask, [0, 2])
    for dtype in (torch.float32, torch.bfloat16):
        dev = logits.to("cuda", dtype)
        apply_token_bitmask(dev, bitmask, [0, 2])
        assert torch.equal(torch.isinf(dev.float().cpu()), torch.isinf(ref))
    tok, grammars = smollm2_grammars()
    state = grammars.compile(constraint({"tool_choice": "required"}, TOOLS))
    dev = torch.randn(2, tok.vocab_size, device="cuda")
    free = dev[1].clone()
    GrammarMasker(tok.vocab_size).apply(dev, [state, None])
    assert torch.equal(dev[1], free)
    allowed = torch.isfinite(dev[0]).nonzero().flatten().tolist()
    assert allowed and all("<tool_call>".startswith(tok.id_to_token(i)) for i in allowed)
    # A batch filled by the pool (pinned buffers, used in turn) masks as the CPU does, step after step.
    states = [grammars.compile(constraint({"tool_choice": "required"}, TOOLS)) for _ in range(6)]
    on_gpu, on_cpu = GrammarMasker(tok.vocab_size, threads=2), GrammarMasker(tok.vocab_size, threads=1)
    for _ in range(3):
        x = torch.randn(7, tok.vocab_size, generator=g)
        y = x.to("cuda")
        on_gpu.apply(y, [*states[:3], None, *states[3:]])
        on_gpu.wait()  # the matchers are the fill thread's until then (masks filled ahead)
        on_cpu.apply(x, [*states[:3], None, *states[3:]])
        assert torch.equal(torch.isinf(y.cpu()), torch.isinf(x))
        for st, row in zip(states, (0, 1, 2, 4, 5, 6), strict=True):
            assert st.matcher.consume_token(int(x[row].argmax()))


def test_masks_filled_by_the_pool_equal_those_filled_in_line() -> None:
    """llguidance's pool (GrammarMasker(threads > 1)) fills a batch's masks as the in-line loop
    does, rows without a grammar left free, step after step (the host buffers used in turn), the
    rows' matchers copied from one compilation or from one per lane: Grammars(lanes=2) deals
    requests to its lanes in turn and compiles a grammar once per lane, on its first request there
    (the pool takes a step's rows sorted by lane)."""
    from switchyard.engine.chat.grammar import GrammarMasker, Grammars
    from switchyard.engine.chat.structured import constraint

    tok, grammars = smollm2_grammars()
    lanes = Grammars(tok.tok.to_str(), tok.vocab_size, sorted(tok.eos_ids), lanes=2)
    c = constraint({"tool_choice": "required"}, TOOLS)
    by_lane = [lanes.compile(c) for _ in range(5)]
    assert [s.lane for s in by_lane] == [0, 1, 0, 1, 0]
    assert lanes.compiled == 2 and lanes.info()["cached_grammars"] == 1 and lanes.info()["lanes"] == 2
    for seed, pool_states in enumerate(([grammars.compile(c) for _ in range(5)], by_lane)):
        line_states = [grammars.compile(c) for _ in range(5)]
        pool, line = GrammarMasker(tok.vocab_size, threads=2), GrammarMasker(tok.vocab_size, threads=1)
        assert pool.executor is not None and line.executor is None
        g = torch.Generator().manual_seed(seed)
        for _ in range(5):
            x = torch.randn(6, tok.vocab_size, generator=g)
            y = x.clone()
            pool.apply(x, [*pool_states[:2], None, *pool_states[2:]])
            line.apply(y, [*line_states[:2], None, *line_states[2:]])
            assert torch.equal(x, y) and torch.isfinite(x[2]).all() and torch.isinf(x[0]).any()
            for a, b, row in zip(pool_states, line_states, (0, 1, 3, 4, 5), strict=True):
                t = int(x[row].argmax())
                assert a.matcher.consume_token(t) and b.matcher.consume_token(t)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU logits through the waiting kernel need Triton's interpreter, "
                    "which runs where no GPU is (the GPU's own: test_gpu_masks_equal_the_cpu_kernel)")
def test_masks_filled_ahead_equal_those_filled_in_line() -> None:
    """Filled ahead (on the masker's thread, the masking kernel waiting for the fill's ticket;
    interpreted here on CPU logits), a batch's masks equal the in-line fill's step after step, the
    free row untouched; the matchers are the thread's until wait(), after which they take the
    step's token. A fill that raises raises on the engine's thread at wait(); a wait the kernel
    gave up on is EngineFailed there."""
    from switchyard.engine.chat.grammar import GrammarMasker, GrammarState
    from switchyard.engine.chat.structured import constraint
    from switchyard.engine.errors import EngineFailed

    tok, grammars = smollm2_grammars()
    ahead_states = [grammars.compile(constraint({"tool_choice": "required"}, TOOLS)) for _ in range(3)]
    line_states = [grammars.compile(constraint({"tool_choice": "required"}, TOOLS)) for _ in range(3)]
    ahead, line = GrammarMasker(tok.vocab_size, ahead=True), GrammarMasker(tok.vocab_size, ahead=False)
    g = torch.Generator().manual_seed(3)
    for step in range(4):
        x = torch.randn(4, tok.vocab_size, generator=g)
        y = x.clone()
        ahead.apply(x, [ahead_states[0], None, *ahead_states[1:]])
        line.apply(y, [line_states[0], None, *line_states[1:]])
        ahead.wait()
        assert ahead._filler is not None and ahead._filler.ticket == step + 1
        assert torch.equal(x, y) and torch.isfinite(x[1]).all() and torch.isinf(x[0]).any()
        for a, b, row in zip(ahead_states, line_states, (0, 2, 3), strict=True):
            t = int(x[row].argmax())
            assert a.matcher.consume_token(t) and b.matcher.consume_token(t)
    assert line._filler is None

    class Broken:
        def unsafe_compute_mask_ptr(self, ptr: int, size: int) -> None:
            raise RuntimeError("fill failed")

    ahead.apply(torch.randn(1, tok.vocab_size), [GrammarState(Broken())])  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="fill failed"):
        ahead.wait()
    ahead.wait()  # raised once
    filler = ahead._filler
    assert filler is not None
    filler.flag.numpy()[1] = filler.ticket  # as the kernel writes it when it gives up
    with pytest.raises(EngineFailed, match="gave up waiting"):
        ahead.wait()


def test_call_parser_streams_what_the_whole_text_gives() -> None:
    from switchyard.engine.chat.tool_stream import ToolCallStream

    text = ('Let me check <that>.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", '
            '"unit": "celsius", "days": [1, {"x": "]"}]}}\n</tool_call>\n<tool_call>\n{"name": "book_trip", '
            '"arguments": {}}\n</tool_call>')
    whole = ToolCallStream(tools=True)
    whole.feed(text)
    whole.finish()
    assert whole.content == "Let me check <that>."
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [
        ("get_weather", {"city": 'Pa"ris}', "unit": "celsius", "days": [1, {"x": "]"}]}), ("book_trip", {})]
    for size in (1, 3, 7):
        s = ToolCallStream(tools=True)
        deltas = [d for i in range(0, len(text), size) for d in s.feed(text[i:i + size])] + s.finish()
        content = "".join(d.get("content", "") for d in deltas)
        calls: dict[int, dict] = {}
        for d in deltas:
            for tc in d.get("tool_calls", []):
                c = calls.setdefault(tc["index"], {"name": None, "arguments": ""})
                if "id" in tc:
                    assert c["name"] is None and tc["type"] == "function"  # the first delta of a call
                    c["name"] = tc["function"]["name"]
                c["arguments"] += tc["function"]["arguments"]
        assert content == whole.content
        assert [(c["name"], c["arguments"]) for c in calls.values()] == [(c.name, c.arguments) for c in whole.calls]
    plain = ToolCallStream(tools=True)
    assert plain.feed("a < b <tool") == [{"content": "a < b"}] and plain.finish() == [{"content": " <tool"}]


def test_request_fields_that_are_wrong_name_their_parameter() -> None:
    from switchyard.engine.chat.structured import constraint
    from switchyard.engine.serving.protocol import RequestError

    cases = [({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, TOOLS, "tool_choice"),
             ({"tool_choice": "sometimes"}, TOOLS, "tool_choice"),
             ({"tool_choice": "required"}, None, "tool_choice"),
             ({"parallel_tool_calls": "yes"}, TOOLS, "parallel_tool_calls"),
             ({"response_format": {"type": "xml"}}, None, "response_format.type"),
             ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}}, None,
              "response_format.json_schema.schema")]
    for body, tools, param in cases:
        with pytest.raises(RequestError) as e:
            constraint(body, tools)
        assert e.value.param == param and e.value.status == 400, body
    assert constraint({}, None) is None and constraint({"response_format": {"type": "text"}}, None) is None
    assert constraint({"tool_choice": "none"}, None) is None


# -- through the server ------------------------------------------------------------------------


def test_required_calls_validate_over_a_dozen_prompts(server: EngineServer) -> None:
    def one(p: str) -> Any:
        return _ask(server, p, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # batched together, as an agent fleet sends them
        replies = list(pool.map(one, PROMPTS))
    names = set()
    for p, r in zip(PROMPTS, replies, strict=True):
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", (p, choice)
        calls = _valid_calls(choice)
        assert len(calls) == 1, (p, calls)
        names.add(calls[0][0])
    assert names == {"get_weather", "book_trip"}  # the model picks the tool, the grammar its shape


def _fitting_tool(prompt: str) -> str:
    """The tool a prompt of PROMPTS asks for (they alternate: weather, trip, weather, ...)."""
    return "get_weather" if PROMPTS.index(prompt) % 2 == 0 else "book_trip"


def test_named_function_calls_validate_over_a_dozen_prompts(server: EngineServer) -> None:
    """The required test's dozen prompts, each naming the tool it asks for; parallel calls are
    left allowed (the default), and a named function still gives exactly one call of it."""
    def one(p: str) -> Any:
        return _ask(server, p, tools=TOOLS, max_tokens=96,
                    tool_choice={"type": "function", "function": {"name": _fitting_tool(p)}})

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        replies = list(pool.map(one, PROMPTS))
    for p, r in zip(PROMPTS, replies, strict=True):
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", (p, choice)
        assert choice.message.content is None, (p, choice.message.content)
        assert [n for n, _ in _valid_calls(choice)] == [_fitting_tool(p)], (p, choice.message.tool_calls)


def test_a_fill_process_gives_the_fill_threads_replies(server: EngineServer, gguf_path: Path,
                                                      tmp_path: Path) -> None:
    """`engine serve --grammar-fill process` (for a GPU replica; here the CPU's logits, the masking
    kernel interpreted): four constrained requests at once get the replies of the server whose
    masks a thread fills, token for token."""
    s = EngineServer(gguf_path, tmp_path / "engine.log",
                     extra=[*INT4_SERVER_ARGS, "--grammar-fill", "process", "--grammar-threads", "2"])
    try:
        def replies(srv: EngineServer) -> list[Any]:  # four at once: one step masks them together
            with ThreadPoolExecutor(4) as pool:
                return [r.choices[0] for r in pool.map(
                    lambda p: _ask(srv, p, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                   max_tokens=80), PROMPTS[:4])]

        for p, a, b in zip(PROMPTS[:4], replies(s), replies(server), strict=True):
            assert a.finish_reason == b.finish_reason == "tool_calls", (p, a, b)
            assert _valid_calls(a) == _valid_calls(b), p
        assert get(s.url + "/health")[1]["structured_output"]["fill"] == "process"  # not a thread fallen back to
    finally:
        s.close()


def test_parallel_calls_validate(server: EngineServer) -> None:
    # Parallel calls allowed (the default): every call the budget let finish validates; a call
    # the budget cut short says "length", never "tool_calls".
    choice = _ask(server, PROMPTS[0], tools=TOOLS, tool_choice="required", max_tokens=150).choices[0]
    calls = choice.message.tool_calls
    assert calls
    if choice.finish_reason == "length":
        calls = calls[:-1]
    else:
        assert choice.finish_reason == "tool_calls"
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_response_format_json_schema_and_object(server: EngineServer) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for p in ("Describe a person as JSON.", "Invent a chess player."):
        choice = _ask(server, p, response_format=rf).choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    choice = _ask(server, "List three colors as a JSON object.", response_format={"type": "json_object"},
                  max_tokens=150).choices[0]
    assert choice.finish_reason == "stop" and isinstance(json.loads(choice.message.content), dict)
    # The budget runs out mid-object: "length", not half a JSON reported as "stop".
    choice = _ask(server, "Describe a person as JSON.", response_format=rf, max_tokens=6).choices[0]
    assert choice.finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.message.content)


def _stream(server: EngineServer, prompt: str, **kw: Any) -> tuple[list[Any], str | None]:
    kw = {"temperature": 0, "max_tokens": 120, **kw}
    chunks = list(_client(server).chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": prompt}], stream=True, **kw))
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return chunks, finish[-1] if finish else None


def test_streamed_calls_add_up_to_the_non_streamed_reply(server: EngineServer) -> None:
    for prompt, choice in ((PROMPTS[1], "required"),):
        kw = {"tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": False}
        whole = _ask(server, prompt, **kw).choices[0]
        chunks, finish = _stream(server, prompt, **kw)
        assert finish == whole.finish_reason == "tool_calls"
        deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        first = deltas[0]
        assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
        assert first.function.name == whole.message.tool_calls[0].function.name
        fragments = [d.function.arguments for d in deltas[1:] if d.function.arguments]
        assert len(fragments) >= 5  # token by token, not one piece at the end
        assert all(d.id is None for d in deltas[1:])
        assert "".join(fragments) == whole.message.tool_calls[0].function.arguments
    # auto, and the model answers in text: the text streams token by token, as without tools.
    prompt = "Say hello to me in one short sentence."
    whole = _ask(server, prompt, tools=TOOLS, max_tokens=24).choices[0]
    chunks, finish = _stream(server, prompt, tools=TOOLS, max_tokens=24)
    text = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert finish == whole.finish_reason
    if not whole.message.tool_calls:
        assert len(text) >= 5 and "".join(text) == whole.message.content


def _shot(i: int, question: str, name: str, args: dict, result: str, answer: str) -> list[dict[str, Any]]:
    """One earlier turn of a conversation: the question, the assistant's call, its result, the answer."""
    call = {"id": f"call_shot{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return [{"role": "user", "content": question}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": result}, {"role": "assistant", "content": answer}]


# Under `auto` SmolLM2-135M answers a lone question in prose (or in JSON-ish pseudo-code outside
# any <tool_call>); after two earlier turns that called a tool it opens a call by itself.
SHOT_PARIS = _shot(1, "What's the weather in Paris for the next 3 days?", "get_weather",
                   {"city": "Paris", "unit": "celsius", "days": 3}, '{"forecast": "sunny, 24C"}',
                   "Sunny, 24C in Paris.")
SHOT_OSLO = _shot(2, "Forecast for Oslo, 5 days.", "get_weather", {"city": "Oslo", "unit": "celsius", "days": 5},
                  '{"forecast": "rain, 9C"}', "Rain, 9C in Oslo.")
SHOT_MADRID = _shot(3, "Book an economy trip to Madrid for Joe, 30.", "book_trip",
                    {"traveler": {"name": "Joe", "age": 30}, "destinations": ["Madrid"], "seat": "economy"},
                    '{"booked": true}', "Booked: Joe to Madrid, economy.")
# 30 days is past get_weather's `maximum: 14`: left free, the model copies the 30.
AUTO_WEATHER = [*SHOT_PARIS, *SHOT_OSLO, {"role": "user", "content": "Forecast for Lima for 30 days."}]
AUTO_TRIP = [*SHOT_PARIS, *SHOT_MADRID, {"role": "user", "content": "Book a business trip to Rome for Ann, 34."}]


def _chatml(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The prompt the engine renders for a chat request (SmolLM2's template is ChatML)."""
    from switchyard.engine.chat.tools import render_tool_messages

    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                   for m in render_tool_messages(messages, tools)) + "<|im_start|>assistant\n"


def test_auto_calls_are_opened_by_the_model_and_constrained(server: EngineServer) -> None:
    """tool_choice auto (the default with tools): the model opens <tool_call> on its own, after
    a conversation whose earlier turns called tools, and from there the call is the grammar's."""
    client = _client(server)

    def chat(messages: list[dict[str, Any]]) -> Any:
        return client.chat.completions.create(model="smollm2-135m", messages=messages, tools=TOOLS,
                                              temperature=0, max_tokens=64)

    def free(messages: list[dict[str, Any]]) -> Any:  # the same prompt, with no grammar at all
        return client.completions.create(model="smollm2-135m", prompt=_chatml(messages, TOOLS),
                                         temperature=0, max_tokens=40)

    with ThreadPoolExecutor(3) as pool:
        weather, trip, unconstrained = pool.map(lambda f: f[0](f[1]),
                                                [(chat, AUTO_WEATHER), (chat, AUTO_TRIP), (free, AUTO_WEATHER)])
    for r, name in ((weather, "get_weather"), (trip, "book_trip")):
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None, choice.message.content
        assert [n for n, _ in _valid_calls(choice)] == [name]
    # Unconstrained, the same prompt (the same tokens) opens the same call by itself and writes
    # "days": 30; under auto the grammar took over after <tool_call> and kept days in 1..14.
    assert unconstrained.usage.prompt_tokens == weather.usage.prompt_tokens
    text = unconstrained.choices[0].text
    assert text.startswith('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"'), text
    free_args = json.loads(text.split("\n")[1])["arguments"]
    assert free_args["days"] == 30
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(free_args, WEATHER)
    args = json.loads(weather.choices[0].message.tool_calls[0].function.arguments)
    assert args["city"] == "Lima" and 1 <= args["days"] <= 14


def test_auto_call_streams_in_deltas_that_add_up(server: EngineServer) -> None:
    client = _client(server)
    kw: dict[str, Any] = {"model": "smollm2-135m", "messages": AUTO_TRIP, "tools": TOOLS, "temperature": 0,
                          "max_tokens": 80}
    with ThreadPoolExecutor(2) as pool:  # side by side: a row's output does not depend on its batch
        whole_f = pool.submit(client.chat.completions.create, **kw)
        chunks = pool.submit(lambda: list(client.chat.completions.create(stream=True, **kw))).result()
        whole = whole_f.result().choices[0]
    assert whole.finish_reason == "tool_calls"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # no text: a call
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == whole.message.tool_calls[0].function.name == "book_trip"
    assert all(d.index == 0 and d.id is None for d in rest)
    fragments = [d.function.arguments for d in deltas if d.function.arguments]
    assert len(fragments) >= 5, fragments  # token by token, not one piece at the end
    arguments = "".join(fragments)
    assert arguments == whole.message.tool_calls[0].function.arguments
    jsonschema.validate(json.loads(arguments), TRIP)


def test_mixed_batches_give_each_request_its_alone_output(server: EngineServer) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    reqs: list[tuple[str, dict[str, Any]]] = [
        (PROMPTS[0], {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}),
        ("What is the capital of France?", {"max_tokens": 16}),
        ("Describe a person as JSON.", {"response_format": rf}),
        (PROMPTS[4], {"tools": TOOLS, "max_tokens": 24}),
    ]

    def key(r: Any) -> tuple:
        m = r.choices[0].message
        return (m.content, [(c.function.name, c.function.arguments) for c in m.tool_calls or []],
                r.choices[0].finish_reason)

    alone = [key(_ask(server, p, **kw)) for p, kw in reqs]
    with ThreadPoolExecutor(len(reqs)) as pool:
        together = list(pool.map(lambda r: key(_ask(server, r[0], **r[1])), reqs))
    assert together == alone


def test_bad_structured_requests_are_openai_400s(server: EngineServer) -> None:
    import openai

    bad_schema = {"type": "object", "properties": {"when": {"type": "string", "format": "no-such-format"}}}
    cases = [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "send_email"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": bad_schema}}],
          "tool_choice": "required"}, "tools.0.function.parameters"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"tool_choice": "required"}, "tool_choice"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            _ask(server, "hi", **kw)
        err = e.value.body
        assert e.value.status_code == 400 and err["param"] == param and err["message"], (kw, err)
        assert set(err) >= {"message", "type", "param", "code"}
    assert _ask(server, "What is 2 + 2?", max_tokens=8).choices[0].message.content  # still serving


def test_health_and_models_say_structured_output(server: EngineServer) -> None:
    status, health = get(server.url + "/health")
    so = health["structured_output"]
    assert status == 200 and so["supported"] and so["backend"].startswith("llguidance"), health
    assert "required" in so["tool_choice"] and "json_schema" in so["response_format"]
    assert so["compiled"] >= 1 and so["cached_grammars"] >= 1  # the tests above compiled some
    assert so["lanes"] == 1 and so["fill"] == "thread"  # a CPU replica fills on one thread (its cores decode)
    status, models = get(server.url + "/v1/models")
    assert models["data"][0]["structured_output"] is True


# -- an agent loop through the gateway -----------------------------------------------------------


@pytest.fixture(scope="module")
def gateway_url(server: EngineServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from procs import start_gateway

    tmp = tmp_path_factory.mktemp("gw")
    policy = tmp / "policy.yaml"
    policy.write_text(f"""
version: 1
name: agent
pools:
  small:
    model: smollm2-135m
    health: {{interval: 5s, timeout: 30s}}  # a busy test machine answers slowly
    replicas:
      - {{url: {server.url}/v1, name: small-0}}
routes:
  - name: default
    pool: small
""")
    proc, url = start_gateway(Path(tmp), [policy])
    yield url
    proc.stop()


def test_agent_loop_call_result_answer_through_the_gateway(gateway_url: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=gateway_url + "/v1", api_key="none", timeout=600, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What's the weather in Paris for 2 days?"}]
    first = client.chat.completions.create(model="auto", messages=messages, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=120)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (name, args), = _valid_calls(choice)
    assert name == "get_weather"
    call = choice.message.tool_calls[0]
    messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump()]})
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": json.dumps({"city": args["city"], "forecast": ["sunny, 24C", "rain, 17C"]})})
    final = client.chat.completions.create(model="auto", messages=messages, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=60)
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length") and not answer.message.tool_calls
    assert answer.message.content and answer.message.content.strip()


# -- the README's tour, through the default policy ------------------------------------------------


@pytest.fixture(scope="module")
def tour_url(server: EngineServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway with policies/default.yaml as shipped (classifier, rules, fallback), both pools
    on this module's one TP=1 replica (`large` through `localhost`: replicas are shared by URL)."""
    from procs import ROOT, start_gateway

    tmp = tmp_path_factory.mktemp("tour")
    text = (ROOT / "policies" / "default.yaml").read_text()
    port = server.url.rsplit(":", 1)[1]
    for shipped, here in (("127.0.0.1:8101/v1", f"127.0.0.1:{port}/v1"), ("127.0.0.1:8201/v1", f"localhost:{port}/v1")):
        assert shipped in text
        text = text.replace(shipped, here)
    # A busy test machine answers health checks slowly; everything else as shipped.
    text = text.replace("    replicas:\n", "    health: {interval: 5s, timeout: 30s}\n    replicas:\n")
    assert text.count("health: {interval") == 2
    (tmp / "default.yaml").write_text(text)
    proc, url = start_gateway(tmp, [tmp / "default.yaml"])
    yield url
    proc.stop()


def _tour_code() -> str:
    from procs import ROOT

    readme = (ROOT / "README.md").read_text()
    tour = readme[readme.index("## A five-minute tour"):]
    return tour[tour.index("```python\n") + len("```python\n"):tour.index("\n```\n")]


def test_readme_tour_runs_as_printed(tour_url: str) -> None:
    """The tour's code, verbatim but for the gateway's address, through the default policy: what
    it prints holds, and its tools example prints what the README says it prints."""
    code = _tour_code()
    assert 'base_url="http://127.0.0.1:8000/v1"' in code
    printed: list[tuple[Any, ...]] = []
    scope: dict[str, Any] = {"print": lambda *a, **kw: printed.append(a)}
    exec(compile(code.replace("http://127.0.0.1:8000/v1", tour_url + "/v1"), "README.md tour", "exec"), scope)
    models, france, headers, *rest = [a for a in printed if a]  # print() alone ends the stream's line
    assert {"auto", "default", "small", "large", "smollm2-135m", "smollm2-135m-tp3"} <= set(models[0])
    assert "Paris" in france[0]
    assert headers[0]["x-switchyard-pool"] == "small" and headers[0]["x-switchyard-rule"] == "default"
    assert headers[0]["x-switchyard-replica"] == "small-0" and headers[0]["x-switchyard-label"] == "simple"
    streamed = [a[0] for a in rest[:-3]]  # the stream's pieces, then the three prints below
    assert all(isinstance(s, str) for s in streamed), streamed
    assert len([s for s in streamed if s]) >= 5 and "".join(streamed).strip()  # chunk by chunk
    tools_line, loop_answer, json_reply = rest[-3:]
    # The tools example: "tool_calls get_weather {"city": "Paris"}", as the comment under it says.
    expected = code[code.index("print(r.choices[0].finish_reason, call.function.name"):].split("\n")[1]
    assert expected.startswith("# ")
    assert " ".join(map(str, tools_line)) == expected[2:]
    assert scope["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather"
    # The agent loop's last turn (tool_choice none) is text, no call.
    assert isinstance(loop_answer[0], str) and loop_answer[0].strip()
    jsonschema.validate(json.loads(json_reply[0]), {
        "type": "object", "properties": {"name": {"type": "string"}, "country": {"type": "string"}},
        "required": ["name", "country"]})
