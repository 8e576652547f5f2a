"""A multi-turn agent trace, and a replayer that measures time to first token per turn.

  python bench/agent_trace.py --out trace.jsonl [--sessions 8 --turns 6 --system-tokens 1500]
  python bench/agent_trace.py --replay trace.jsonl --url http://127.0.0.1:8080/v1 [--concurrency 8]

Each session is an agent: a ~1.5k-token system prompt (its role, then the docs of its tools),
a first user message, and on every later turn the history so far plus what one loop of an
agent adds: the assistant's tool call, the tool's result, and a new user message. The calls
and results are fixed by the trace (not the model's replies), so every replay sends the same
prompts, and turn k's prompt is turn k-1's plus the new messages: what prefix caching and
cache-aware routing are for. By default every session has its own system prompt and tools
(agents of different teams); --shared-system gives all sessions one.

The tool docs are text in the system prompt, so that a stream's first token arrives as it is
generated (the engine holds a reply's text back when a request carries `tools`, to parse the
calls out of it); --tools-field sends them as OpenAI `tools` instead, and then the "TTFT" of a
stream is the time to its first content or tool-call chunk.

Used by bench/prefix_cache.py (one engine with and without prefix caching), and meant for
replaying through the gateway against several replicas (`replay(..., headers=...)` returns
each response's x-switchyard-* headers).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_VERBS = ["search", "read", "write", "list", "create", "update", "delete", "run", "fetch", "summarize", "compare",
          "schedule", "approve", "deploy", "query", "tag", "archive", "notify", "translate", "validate"]
_NOUNS = ["file", "ticket", "invoice", "calendar_event", "pull_request", "build", "customer", "order", "log",
          "metric", "document", "email", "dataset", "container", "alert", "contract", "shipment", "report",
          "branch", "user"]
_TEAMS = ["payments", "search", "mobile", "infra", "support", "billing", "growth", "security", "data", "design"]
_FIELDS = ["id", "name", "query", "path", "limit", "owner", "status", "since", "until", "priority", "region",
           "format", "tags", "reason", "dry_run", "page", "sort", "language", "team", "comment"]
_WORDS = [
    "the", "a", "of", "to", "and", "in", "for", "on", "with", "by", "from", "at", "as", "is", "are", "be",
    "this", "that", "each", "every", "when", "which", "if", "then", "returns", "lists", "records", "item",
    "items", "result", "results", "field", "fields", "value", "values", "request", "requests", "page", "pages",
    "user", "users", "team", "teams", "owner", "status", "error", "errors", "time", "date", "range", "filter",
    "filters", "sorted", "newest", "oldest", "first", "last", "only", "also", "never", "always", "must", "may",
    "should", "default", "optional", "required", "format", "json", "text", "markdown", "csv", "id", "ids",
    "name", "names", "total", "count", "limit", "offset", "cursor"
]
CHARS_PER_TOKEN = 3.9  # SmolLM2's tokenizer on this mix of prose and JSON (measured: 3.8-4.0)


@dataclass(frozen=True)
class Turn:
    session: str
    turn: int  # 1-based
    body: dict[str, Any]  # an OpenAI chat completion request


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + "."


def _tool(rng: random.Random) -> dict[str, Any]:
    name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
    props = {f: {"type": rng.choice(["string", "integer", "boolean"]), "description": _sentence(rng, rng.randint(5, 10))}
             for f in rng.sample(_FIELDS, rng.randint(2, 4))}
    return {"type": "function", "function": {
        "name": name, "description": " ".join(_sentence(rng, rng.randint(8, 14)) for _ in range(2)),
        "parameters": {"type": "object", "properties": props, "required": list(props)[:1]}}}


def _system(rng: random.Random, label: str, system_tokens: int) -> tuple[str, list[dict[str, Any]]]:
    team = rng.choice(_TEAMS)
    head = (f"You are {label}, the operations agent of the {team} team. Work step by step, call one tool at "
            f"a time, and answer the user in short plain sentences. Never invent tool results. "
            f"{_sentence(rng, 14)} {_sentence(rng, 12)}")
    tools: list[dict[str, Any]] = []
    text = head
    budget = system_tokens * CHARS_PER_TOKEN
    while len(text) < budget:
        tools.append(_tool(rng))
        text = head + "\n\n# Tools\n" + "\n".join(json.dumps(t["function"]) for t in tools)
    return text, tools


def _result(rng: random.Random, tool: str) -> str:
    rows = [{"id": rng.randrange(10_000), "name": f"{rng.choice(_NOUNS)}-{rng.randrange(1000)}",
             "status": rng.choice(["open", "closed", "pending", "failed", "ok"]), "note": _sentence(rng, 6)}
            for _ in range(rng.randint(3, 5))]
    return json.dumps({"tool": tool, "count": len(rows), "items": rows})


def make_trace(sessions: int = 8, turns: int = 6, system_tokens: int = 1500, seed: int = 0,
               shared_system: bool = False, tools_field: bool = False, model: str = "smollm2-135m",
               max_tokens: int = 16) -> list[list[Turn]]:
    """sessions x turns requests, each session's turns in order. Greedy, streamed, with usage."""
    out = []
    shared = _system(random.Random(seed), "Atlas", system_tokens) if shared_system else None
    for s in range(sessions):
        rng = random.Random(seed * 1000 + s + 1)
        system, tools = shared or _system(rng, f"Agent-{s}", system_tokens)
        # --tools-field: the docs go in `tools`, the system prompt keeps its head.
        sysmsg = system.split("\n\n# Tools\n")[0] if tools_field else system
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": sysmsg},
            {"role": "user", "content": f"Session {s}: {_sentence(rng, 18)} Start with the open items."}]
        session: list[Turn] = []
        for t in range(1, turns + 1):
            if t > 1:
                tool = rng.choice(tools)["function"]["name"]
                call_id = f"call_{s}_{t}"
                args = {"query": _sentence(rng, 4), "limit": rng.randint(5, 50)}
                messages = [*messages,
                            {"role": "assistant", "content": None, "tool_calls": [
                                {"id": call_id, "type": "function",
                                 "function": {"name": tool, "arguments": json.dumps(args)}}]},
                            {"role": "tool", "tool_call_id": call_id, "content": _result(rng, tool)},
                            {"role": "user", "content": f"{_sentence(rng, 12)} What next?"}]
            body: dict[str, Any] = {"model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens,
                                    "stream": True, "stream_options": {"include_usage": True}}
            if tools_field:
                body["tools"] = tools
            session.append(Turn(f"s{s}", t, body))
        out.append(session)
    return out


def write_jsonl(trace: list[list[Turn]], path: Path) -> None:
    with path.open("w") as f:
        for session in trace:
            for t in session:
                f.write(json.dumps(asdict(t)) + "\n")


def read_jsonl(path: Path) -> list[list[Turn]]:
    by: dict[str, list[Turn]] = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        by.setdefault(d["session"], []).append(Turn(d["session"], d["turn"], d["body"]))
    return [sorted(v, key=lambda t: t.turn) for v in by.values()]


@dataclass
class Result:
    session: str
    turn: int
    ttft_s: float  # to the first chunk with content or tool calls
    latency_s: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    headers: dict[str, str] = field(default_factory=dict)  # x-switchyard-* of the response
    error: str = ""


def send(url: str, turn: Turn, headers: dict[str, str] | None = None, timeout: float = 600.0) -> Result:
    """POST one streamed turn to `url`/chat/completions and time it."""
    req = urllib.request.Request(url.rstrip("/") + "/chat/completions", data=json.dumps(turn.body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    start = time.perf_counter()
    first = None
    usage: dict[str, Any] = {}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            hdrs = {k.lower(): v for k, v in r.headers.items() if k.lower().startswith("x-switchyard")}
            for line in r:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if obj.get("usage"):
                    usage = obj["usage"]
                for c in obj.get("choices") or []:
                    d = c.get("delta") or {}
                    if first is None and (d.get("content") or d.get("tool_calls")):
                        first = time.perf_counter()
    except Exception as e:  # a replay reports failures instead of stopping
        return Result(turn.session, turn.turn, float("nan"), time.perf_counter() - start, error=str(e))
    end = time.perf_counter()
    return Result(turn.session, turn.turn, (first or end) - start, end - start, usage.get("prompt_tokens", 0),
                  (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                  usage.get("completion_tokens", 0), hdrs)


def replay(url: str, trace: list[list[Turn]], concurrency: int = 1,
           headers: Callable[[Turn], dict[str, str]] | None = None,
           on_result: Callable[[Result], None] | None = None,
           think: Callable[[Turn], float] | None = None) -> list[Result]:
    """Sessions in parallel (up to `concurrency` at once), each session's turns in order, the
    next sent when the previous one is done. headers(turn): extra request headers (default:
    x-session-id, which the gateway's session pinning and routing read). think(turn): seconds
    to wait before sending it (the agent running its tool; on turn 1, the session's arrival):
    without it, a closed loop of concurrent sessions keeps least_inflight on each session's
    replica by accident (a session's own finished request is what makes its replica the least
    loaded one)."""
    headers = headers or (lambda t: {"x-session-id": t.session})
    results: list[Result] = []
    lock = threading.Lock()

    def run(session: list[Turn]) -> None:
        for t in session:
            if think:
                time.sleep(think(t))
            r = send(url, t, headers(t))
            with lock:
                results.append(r)
            if on_result:
                on_result(r)

    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        list(pool.map(run, trace))
    return results


def per_turn(results: list[Result]) -> Iterator[tuple[int, list[Result]]]:
    for t in sorted({r.turn for r in results}):
        yield t, [r for r in results if r.turn == t]


def hit_rate(results: list[Result], from_turn: int = 1) -> float:
    rs = [r for r in results if r.turn >= from_turn and not r.error]
    prompt = sum(r.prompt_tokens for r in rs)
    return sum(r.cached_tokens for r in rs) / prompt if prompt else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the trace as JSONL")
    ap.add_argument("--replay", type=Path, help="replay a JSONL trace against --url")
    ap.add_argument("--url", default="http://127.0.0.1:8101/v1")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shared-system", action="store_true")
    ap.add_argument("--tools-field", action="store_true")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-tokens", type=int, default=16)
    a = ap.parse_args()
    if a.replay:
        results = replay(a.url, read_jsonl(a.replay), a.concurrency)
        for t, rs in per_turn(results):
            print(f"turn {t}: TTFT median {statistics.median(r.ttft_s for r in rs) * 1000:.0f} ms, "
                  f"cached {sum(r.cached_tokens for r in rs)}/{sum(r.prompt_tokens for r in rs)} prompt tokens")
        print(f"hit rate {hit_rate(results):.3f} (turns 2+: {hit_rate(results, 2):.3f}); "
              f"errors {sum(bool(r.error) for r in results)}")
        return
    trace = make_trace(a.sessions, a.turns, a.system_tokens, a.seed, a.shared_system, a.tools_field, a.model,
                       a.max_tokens)
    if a.out:
        write_jsonl(trace, a.out)
        print(f"wrote {sum(map(len, trace))} requests ({a.sessions} sessions x {a.turns} turns) to {a.out}")


if __name__ == "__main__":
    main()
