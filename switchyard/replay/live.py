"""Live replay: each case as an OpenAI chat request to a gateway (or any OpenAI server).

Bounded concurrency, a timeout per request, retries on connection errors, timeouts, 429
and 502/503/504 (counted per case). When the gateway cannot be reached at all, the run
stops: cases not yet sent are marked skipped and everything done so far is kept.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from switchyard.replay.cases import Case
from switchyard.replay.results import CaseResult
from switchyard.replay.scoring import Call, score_case

RETRY_STATUS = {429, 502, 503, 504}


def api_base(url: str) -> str:
    """`http://h:p`, `http://h:p/` or `http://h:p/v1` -> `http://h:p/v1`."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def parse_tool_calls(message: dict[str, Any], name_map: dict[str, str]) -> list[Call] | None:
    """The calls in an assistant message, names mapped back; None if any is unreadable."""
    raw = message.get("tool_calls") or []
    if not raw and isinstance(message.get("function_call"), dict):
        raw = [{"function": message["function_call"]}]
    calls: list[Call] = []
    for tc in raw:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return None
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = orjson.loads(args) if args.strip() else {}
            except orjson.JSONDecodeError:
                return None
        if not isinstance(args, dict):
            return None
        calls.append({name_map.get(fn["name"], fn["name"]): args})
    return calls


def _label_headers(h: httpx.Headers) -> tuple[str | None, float | None]:
    # The gateway sends the label name ("none" without a classifier) and, apart, its confidence.
    name = h.get("x-switchyard-label")
    if not name or name == "none":
        return None, None
    try:
        conf = float(h.get("x-switchyard-confidence", ""))
    except ValueError:
        conf = None
    return name, conf


class LiveClient:
    def __init__(
        self,
        gateway: str,
        concurrency: int = 4,
        timeout: float = 120.0,
        retries: int = 2,
        extra_body: dict[str, Any] | None = None,
    ):
        self.base = api_base(gateway)
        self.concurrency = max(1, concurrency)
        self.timeout = timeout
        self.retries = max(0, retries)
        self.extra_body = extra_body or {}
        self.unreachable: str | None = None
        self.interrupted: str | None = None

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]) -> tuple[httpx.Response | None, str, int]:
        """(response, error, retries used)."""
        error = ""
        for attempt in range(self.retries + 1):
            if self.unreachable:
                return None, self.unreachable, attempt
            try:
                resp = await client.post(f"{self.base}/chat/completions", content=orjson.dumps(body), headers=headers)
            except httpx.ConnectError as e:
                error = f"cannot connect to {self.base}: {e or type(e).__name__}"
            except httpx.TimeoutException as e:
                error = f"timed out after {self.timeout:g}s ({type(e).__name__})"
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code not in RETRY_STATUS or attempt == self.retries:
                    return resp, "", attempt
                error = f"HTTP {resp.status_code}"
            if attempt < self.retries:
                await asyncio.sleep(min(2.0, 0.2 * 2**attempt))
        if error.startswith("cannot connect"):
            self.unreachable = error
        return None, error, self.retries

    async def send(self, client: httpx.AsyncClient, case: Case, model: str, forced_pool: str | None) -> CaseResult:
        r = CaseResult(case.id, case.category, case.tier, case.kind, pool=forced_pool)
        if self.unreachable:
            r.status, r.error = "skipped", f"not sent: {self.unreachable}"
            return r
        body = case.request(model, {"stream": False, **self.extra_body})
        if not body.get("tools"):
            body.pop("tool_choice", None)  # a forced tool_choice applies to cases with tools only
        headers = {"content-type": "application/json"}
        if case.session_id:
            headers["x-session-id"] = case.session_id
        t0 = time.perf_counter()
        resp, error, retries = await self._post(client, body, headers)
        r.latency_ms = round((time.perf_counter() - t0) * 1000, 2)
        r.retries = retries
        if resp is None:
            r.status, r.error = "error", error
            r.correct = False if case.kind != "none" else None
            return r
        h = resp.headers
        r.http_status = resp.status_code
        r.pool = h.get("x-switchyard-pool") or forced_pool
        r.rule = h.get("x-switchyard-rule")
        r.label, r.confidence = _label_headers(h)
        try:
            data = resp.json()
        except ValueError:
            data = None
        if resp.status_code != 200 or not isinstance(data, dict):
            msg = ""
            if isinstance(data, dict) and isinstance(data.get("error"), dict):
                msg = str(data["error"].get("message", ""))
            r.status, r.error = "error", f"HTTP {resp.status_code}: {msg or resp.text[:200]}"
            r.correct = False if case.kind != "none" else None
            return r
        served_by = data.get("model")
        r.served_by = served_by if isinstance(served_by, str) and served_by else None
        usage = data.get("usage") or {}
        r.prompt_tokens = usage.get("prompt_tokens")
        r.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            r.cached_tokens = details["cached_tokens"]
        try:  # what the gateway charged, at its pool's price
            r.cost_usd = float(h["x-switchyard-cost-usd"]) if "x-switchyard-cost-usd" in h else None
        except ValueError:
            r.cost_usd = None
        choices = data.get("choices") or [{}]
        message = choices[0].get("message") or {}
        calls = parse_tool_calls(message, case.name_map)
        r.calls = calls
        verdict = score_case(case, calls)
        if verdict is not None:
            r.correct = verdict.correct
            r.error = verdict.error
        return r

    async def run(
        self,
        cases: list[Case],
        model: str,
        forced_pool: str | None = None,
        on_done: Callable[[CaseResult], None] | None = None,
    ) -> list[CaseResult]:
        """Every case's result, in case order. SIGINT/SIGTERM stop the run: requests in flight
        are cancelled, the rest marked skipped, and what was answered is kept."""
        sem = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        timeout = httpx.Timeout(self.timeout, connect=min(5.0, self.timeout))
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:

            async def one(case: Case) -> CaseResult:
                async with sem:
                    res = await self.send(client, case, model, forced_pool)
                if on_done:
                    on_done(res)
                return res

            tasks = [asyncio.create_task(one(c)) for c in cases]
            installed = _on_signals(lambda name: self._interrupt(name, tasks))
            try:
                done = await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                _remove_signals(installed)
        out: list[CaseResult] = []
        for case, r in zip(cases, done, strict=True):
            if isinstance(r, CaseResult):
                out.append(r)
            elif isinstance(r, asyncio.CancelledError):
                out.append(CaseResult(case.id, case.category, case.tier, case.kind, pool=forced_pool,
                                      status="skipped", error=f"not answered: {self.interrupted or 'cancelled'}"))
            else:
                raise r
        return out

    def _interrupt(self, signame: str, tasks: list[asyncio.Task[CaseResult]]) -> None:
        self.interrupted = f"interrupted by {signame}"
        for t in tasks:
            t.cancel()


def _on_signals(handler: Callable[[str], None]) -> list[signal.Signals]:
    installed = []
    try:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, handler, sig.name)
            installed.append(sig)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        pass
    return installed


def _remove_signals(installed: list[signal.Signals]) -> None:
    loop = asyncio.get_running_loop()
    for sig in installed:
        loop.remove_signal_handler(sig)
