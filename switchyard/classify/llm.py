"""The small-LLM classifier: ask a pool's model for one label word, read confidence from logprobs.

One chat completion per request (`max_tokens: 1`, `logprobs`, `top_logprobs`), sent through the
gateway's own pool (the `call_pool` the gateway supplies), under a hard time budget. Past the
budget, or on any error or unparseable answer, it fails open to the policy's failure label with
kind "fail-open". Its own circuit breaker: after `breaker_failures` consecutive failures it does
not call at all for `breaker_cooldown` seconds (still failing open, instantly), then lets one
trial call through.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from switchyard.classify.base import Label
from switchyard.classify.features import Features

CallPool = Callable[[str, dict, float], Awaitable[dict]]

DEFAULT_PROMPT = (
    "You route requests for an AI assistant that calls tools. Decide whether the request below is "
    "simple (one tool call or none, one clear step) or complex (several tool calls, several tools, "
    "several steps, or careful reasoning). Answer with exactly one word from: {labels}."
)
_MAX_TEXT = 1500  # the classifier model needs the gist, not the whole conversation


def _describe(features: Features, body: dict) -> str:
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    names = []
    for t in tools[:20]:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    lines = [f"Request: {features.text[:_MAX_TEXT]}"]
    lines.append(f"Tools offered: {features.tools}" + (f" ({', '.join(names)})" if names else ""))
    if features.turns > 1 or features.tool_result:
        lines.append(f"Conversation: {features.turns} user turns, {features.tool_calls_so_far} tool calls so far")
    return "\n".join(lines)


class LLMClassifier:
    kind = "llm"

    def __init__(
        self,
        pool: str,
        call_pool: CallPool,
        labels: list[str],
        failure_label: str,
        timeout: float = 0.2,
        prompt: str | None = None,
        breaker_failures: int = 3,
        breaker_cooldown: float = 10.0,
        top_logprobs: int = 10,
    ) -> None:
        self.pool = pool
        self._call = call_pool
        self.labels = list(labels)
        self.failure_label = failure_label
        self.timeout = timeout
        self.instruction = (prompt or DEFAULT_PROMPT).replace("{labels}", ", ".join(self.labels))
        self.breaker_failures = breaker_failures
        self.breaker_cooldown = breaker_cooldown
        self.top_logprobs = top_logprobs
        # Counters for the gateway's metrics and /health (plain attributes, read any time).
        self.calls = 0  # classifications asked for
        self.ok_count = 0
        self.fail_open_count = 0  # all fail-opens, including the three causes below
        self.timeout_count = 0
        self.error_count = 0  # HTTP/transport errors and unparseable answers
        self.skipped_count = 0  # failed open without calling: breaker open
        self.last_error: str | None = None
        self.consecutive_failures = 0
        self.open_until = 0.0  # monotonic time; > now means the breaker is open
        self._trial = False  # a half-open trial call is in flight

    @property
    def breaker_open(self) -> bool:
        return time.monotonic() < self.open_until

    def request_body(self, features: Features, body: dict) -> dict[str, Any]:
        return {
            "model": self.pool,  # the gateway rewrites it to the pool's upstream model
            "messages": [
                {"role": "system", "content": self.instruction},
                {"role": "user", "content": _describe(features, body) + "\nAnswer:"},
            ],
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": self.top_logprobs,
            "stream": False,
        }

    def _match(self, token: str) -> str | None:
        """The label a generated token starts (" Comp" -> complex), if exactly one fits."""
        t = token.strip().lower()
        if not t:
            return None
        hits = [lab for lab in self.labels if lab.lower().startswith(t) or t.startswith(lab.lower())]
        return hits[0] if len(hits) == 1 else None

    def parse(self, response: dict) -> tuple[str, float]:
        """(label, confidence) from a chat completion; ValueError if no label can be read."""
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ValueError("response has no choices")
        choice = choices[0]
        mass: dict[str, float] = {}
        content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
        if isinstance(content, list) and content and isinstance(content[0], dict):
            first = content[0]
            cands = first.get("top_logprobs") or [first]
            for cand in cands:
                if not isinstance(cand, dict):
                    continue
                lab = self._match(str(cand.get("token", "")))
                lp = cand.get("logprob")
                if lab is not None and isinstance(lp, int | float) and math.isfinite(lp):
                    mass[lab] = mass.get(lab, 0.0) + math.exp(lp)
        if mass:
            total = sum(mass.values())
            best = max(mass, key=mass.__getitem__)
            # Renormalised over the label tokens: the share of label probability the winner holds.
            return best, mass[best] / total
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        text = message.get("content") or choice.get("text") or ""
        lab = self._match(str(text))
        if lab is None:
            raise ValueError(f"answer {str(text)[:40]!r} is none of the labels {self.labels}")
        # No logprobs from this server: the word alone, with no measure of doubt.
        return lab, 1.0

    def _fail(self, t0: float, reason: str, kind: str) -> Label:
        self.fail_open_count += 1
        if kind == "timeout":
            self.timeout_count += 1
        elif kind == "error":
            self.error_count += 1
        if kind != "skipped":
            self.last_error = reason
            self.consecutive_failures += 1
            if self.consecutive_failures >= self.breaker_failures:
                self.open_until = time.monotonic() + self.breaker_cooldown
        # Confidence 1.0: on_failure is the policy's decision, not a guess; with 0.0 a rule like
        # `{label: complex, confidence: ">= 0.6"}` would skip it and send the request to the small pool.
        return Label(self.failure_label, 1.0, "fail-open", (time.perf_counter() - t0) * 1000.0)

    async def classify(self, features: Features, body: dict) -> Label:
        t0 = time.perf_counter()
        self.calls += 1
        if self.consecutive_failures >= self.breaker_failures:
            if self.breaker_open or self._trial:
                self.skipped_count += 1
                return self._fail(t0, "breaker open", "skipped")
            self._trial = True  # cooldown over: this call is the one trial
        try:
            req = self.request_body(features, body)
            response = await asyncio.wait_for(self._call(self.pool, req, self.timeout), self.timeout)
            name, conf = self.parse(response)
        except TimeoutError:
            return self._fail(t0, f"no answer within {self.timeout * 1000:.0f} ms", "timeout")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # any failure of the classifier must not fail the request
            # Client libraries have their own timeout types (httpx.ReadTimeout, ...): count them as such.
            kind = "timeout" if "timeout" in type(e).__name__.lower() else "error"
            return self._fail(t0, f"{type(e).__name__}: {e}"[:300], kind)
        finally:
            self._trial = False
        self.ok_count += 1
        self.consecutive_failures = 0
        self.open_until = 0.0
        return Label(name, conf, self.kind, (time.perf_counter() - t0) * 1000.0)

    async def aclose(self) -> None:
        return None
