"""The session loop: a multi-turn case run live through a gateway (or any OpenAI server).

Per user turn, as BFCL's FC inference does: the turn's messages join the conversation (a turn that
hands over held-out functions gets BFCL's "I have updated some more functions" message and the
new tools), the model is asked, its tool calls run in the case's environment and go back as tool
messages, until it answers without a call (or with calls that cannot be read) or the step cap is
passed (the session is then cut short there, and fails, as BFCL's force-quit does). Every request
carries the session id (x-session-id, and `user` for upstreams that see only the body) so the
gateway routes, pins and escalates per turn as it would in production, and every step records
where it went (x-switchyard-pool, rule, label) and which model answered.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from switchyard.replay.live import RETRY_STATUS, _label_headers, api_base
from switchyard.replay.multiturn.data import MAX_STEPS, SessionCase
from switchyard.replay.multiturn.env import Call, Environment


@dataclass(slots=True)
class Step:
    pool: str | None = None
    rule: str | None = None
    label: str | None = None
    confidence: float | None = None
    served_by: str | None = None
    http_status: int | None = None
    latency_ms: float = 0.0
    # What the model said, as BFCL stores it: [{name: arguments JSON}] for tool calls, else its text.
    response: list[dict[str, str]] | str = ""
    calls: list[dict[str, Any]] | None = None  # decoded {name: args}; None: no call, or unreadable
    results: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(slots=True)
class Turn:
    steps: list[Step] = field(default_factory=list)


@dataclass(slots=True)
class SessionRecord:
    id: str
    category: str
    session_id: str
    turns: list[Turn] = field(default_factory=list)
    n_turns: int = 0  # the case's turns (a session cut short has fewer records)
    force_quit: bool = False
    error: str | None = None
    wall_s: float = 0.0
    verdict: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SessionRecord:
        turns = [Turn([Step(**s) for s in t["steps"]]) for t in d.get("turns", [])]
        return cls(**{**d, "turns": turns})

    def decoded(self) -> list[list[list[Call]]]:
        """Per turn, per step with readable calls, the calls: what the checker executes."""
        return [[[Call.of(n, a) for c in s.calls for n, a in c.items()] for s in t.steps if s.calls]
                for t in self.turns]


def decode(message: dict[str, Any]) -> tuple[list[dict[str, str]] | str, list[dict[str, Any]] | None]:
    """(response as BFCL stores it, decoded calls or None). As BFCL's decoder: every call's
    arguments must be a JSON object, else the whole step is unreadable."""
    raw = message.get("tool_calls") or []
    if not raw:
        return str(message.get("content") or ""), None
    response: list[dict[str, str]] = []
    calls: list[dict[str, Any]] | None = []
    for tc in raw:
        fn = tc.get("function") if isinstance(tc, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not isinstance(args, str | dict):
            return response, None
        text = args if isinstance(args, str) else json.dumps(args)
        response.append({name: text})
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            calls = None
        elif calls is not None:
            calls.append({name: parsed})
    return response, calls or None


class SessionClient:
    def __init__(self, gateway: str, model: str, timeout: float = 120.0, retries: int = 2,
                 extra_body: dict[str, Any] | None = None, max_steps: int = MAX_STEPS):
        self.base = api_base(gateway)
        self.model = model
        self.timeout = timeout
        self.retries = retries
        self.extra = extra_body or {}
        self.max_steps = max_steps

    async def _ask(self, client: httpx.AsyncClient, body: dict[str, Any], sid: str) -> tuple[httpx.Response | None, str]:
        error = ""
        for attempt in range(self.retries + 1):
            try:
                resp = await client.post(f"{self.base}/chat/completions", json=body,
                                         headers={"x-session-id": sid})
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code not in RETRY_STATUS or attempt == self.retries:
                    return resp, ""
                error = f"HTTP {resp.status_code}"
        return None, error

    async def run(self, client: httpx.AsyncClient, case: SessionCase, session_id: str) -> SessionRecord:
        rec = SessionRecord(case.id, case.category, session_id, n_turns=len(case.turns))
        env = Environment(case.involved_classes, case.initial_config, case.long_context)
        messages: list[dict[str, Any]] = []
        t_start = time.perf_counter()
        for k in range(len(case.turns)):
            turn, cut, error = await self.run_turn(client, case, k, env, messages, session_id)
            rec.turns.append(turn)
            if cut or error:
                rec.force_quit, rec.error = cut, error
                break
        rec.wall_s = round(time.perf_counter() - t_start, 3)
        return rec

    async def run_turn(self, client: httpx.AsyncClient, case: SessionCase, k: int, env: Environment,
                       messages: list[dict[str, Any]], session_id: str) -> tuple[Turn, bool, str | None]:
        """Turn k on `messages` (extended in place) and `env`: (the turn, cut short, error)."""
        tools, _ = case.tools_at(k)
        messages.extend(case.turn_messages(k))
        turn = Turn()
        while True:
            step = Step()
            turn.steps.append(step)
            body = {"model": self.model, "messages": messages, "tools": tools, "stream": False,
                    "user": session_id, **self.extra}
            t0 = time.perf_counter()
            resp, error = await self._ask(client, body, session_id)
            step.latency_ms = round((time.perf_counter() - t0) * 1000, 2)
            if resp is None or resp.status_code != 200:
                step.http_status = resp.status_code if resp is not None else None
                step.error = error or f"HTTP {resp.status_code if resp else '?'}: {resp.text[:200] if resp else ''}"
                return turn, False, step.error  # a session the gateway could not serve is cut short: it fails
            h = resp.headers
            step.http_status, step.pool, step.rule = 200, h.get("x-switchyard-pool"), h.get("x-switchyard-rule")
            step.label, step.confidence = _label_headers(h)
            try:
                data = resp.json()
            except ValueError:
                step.error = f"HTTP 200 with a body that is not JSON: {resp.text[:200]!r}"
                return turn, False, step.error
            step.served_by = data.get("model") if isinstance(data, dict) else None
            message = ((data.get("choices") or [{}])[0].get("message") or {}) if isinstance(data, dict) else {}
            step.response, step.calls = decode(message)
            if step.calls is None:
                # The turn ends here (BFCL: empty or undecodable). Unreadable calls leave the
                # history without them, so the next turn is still a valid conversation.
                messages.append({"role": "assistant", "content": message.get("content") or ""})
                return turn, False, None
            raw_calls = message.get("tool_calls") or []
            messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": raw_calls})
            step.results = env.execute([Call.of(n, a) for c in step.calls for n, a in c.items()])
            for i, result in enumerate(step.results):
                call_id = raw_calls[i].get("id") if i < len(raw_calls) else None
                messages.append({"role": "tool", "content": result, "tool_call_id": call_id or f"call_{i}"})
            if len(turn.steps) > self.max_steps:
                return turn, True, None
