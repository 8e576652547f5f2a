"""Context windows: how many tokens each pool's replicas hold, and which pools a request fits.

A pool's window is its policy's `max_model_len`, else what its replicas report of themselves,
read when a health check finds one up (`discover`): `max_model_len` in `/v1/models` (vLLM,
SGLang, our engine), else llama-server's `meta.n_ctx` there or its `/props` (the context of one
slot, what one request gets), else its `meta.n_ctx_train`. A pool whose window is unknown takes every request (the
upstream is then the judge, as before).

The prompt's size is an estimate, not a tokenization (the gateway has no tokenizer of the
pool's model): the bytes of the normalised chat body over BYTES_PER_TOKEN, plus SAFETY. On
agent requests (Claude Code, Codex CLI, trimmed and not) SmolLM2's tokenizer, chat template
included, gave 3.8-4.3 bytes a token, so the estimate is within -5%..+7%; the 10% margin keeps
a clamped `max_tokens` inside the window for engines that refuse prompt + max_tokens > window
(vLLM, ours). Text that tokenizes much worse than English (CJK on an English vocabulary) can
still be under-counted; the upstream's own 400 says so then.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from switchyard import errors
from switchyard.pools.pool import Pool
from switchyard.pools.replica import Replica

log = logging.getLogger("switchyard.fit")

BYTES_PER_TOKEN = 4.0
SAFETY = 1.10
# Room a request must leave for its answer to be worth sending (or its own max_tokens, if less).
MIN_COMPLETION = 256
# The completion budget under each API's name, as a normalised or a native body spells it.
MAX_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MAX_DISCOVERY_BYTES = 256 * 1024


# What a server's chat template adds that the body's bytes do not show: role markers and a
# default system prompt (SmolLM2's: ~30 tokens), and, with tools, the instructions that present
# them (our engine's: ~90 tokens; a short tool request measured 117 estimated vs 205 real).
TEMPLATE_TOKENS = 32
TOOLS_PROMPT_TOKENS = 96


def estimate(body: Mapping[str, Any], size: int | None = None) -> int:
    """Prompt tokens of a normalised chat body, with the safety margin (see the module's note).
    `size`: the body's bytes when the caller knows them (the client's own chat body as it came:
    no encoding of it again just to count)."""
    extra = TEMPLATE_TOKENS + (TOOLS_PROMPT_TOKENS if body.get("tools") else 0)
    n = len(orjson.dumps(body)) if size is None else size
    return math.ceil(n / BYTES_PER_TOKEN * SAFETY) + extra


def window(pool: Pool) -> int | None:
    """The pool's context window in tokens: the policy's, else the smallest its replicas reported."""
    if pool.spec.max_model_len:
        return pool.spec.max_model_len
    seen = [w for r in pool.replicas if (w := r.window_for(pool.model)) is not None]
    return min(seen) if seen else None


def _asked(body: Mapping[str, Any]) -> dict[str, int]:
    return {k: v for k in MAX_KEYS if isinstance(v := body.get(k), int) and not isinstance(v, bool) and v > 0}


@dataclass(slots=True)
class Plan:
    """The pools of a decision's chain that the request fits, in order, each with the completion
    tokens its window leaves (None: window unknown)."""

    chain: list[tuple[str, int | None]]
    prompt_tokens: int = 0
    _asked: dict[int, dict[str, int]] = field(default_factory=dict)  # id(body) -> its own budgets

    def apply(self, body: dict[str, Any], room: int | None) -> None:
        """Lower the body's completion budget to `room` (a cap, never a refusal: agents ask 32000
        of any model). Called once per pool tried; a later pool gets the client's own value back."""
        asked = self._asked.setdefault(id(body), _asked(body))
        for k, v in asked.items():
            body[k] = v if room is None or v <= room else room


def plan(pools: Mapping[str, Pool], chain: Sequence[str], body: Mapping[str, Any], size: int | None = None) -> Plan:
    """Which pools of `chain` the request fits. Raises errors.ContextTooLong when none does.
    `size`: the body's bytes, when known (estimate)."""
    windows = {p: window(pools[p]) for p in chain if p in pools}
    if all(w is None for w in windows.values()):
        return Plan([(p, None) for p in chain])
    need = estimate(body, size)
    asked = _asked(body)
    least = min(MIN_COMPLETION, *asked.values()) if asked else MIN_COMPLETION
    out: list[tuple[str, int | None]] = []
    for p in chain:
        w = windows.get(p)
        if w is None:
            out.append((p, None))
        elif need + least <= w:
            out.append((p, w - need))
        else:
            log.debug("pool %r skipped: about %d prompt tokens + %d do not fit its %d", p, need, least, w)
    if not out:
        raise errors.ContextTooLong(need, max(w for w in windows.values() if w is not None), least)
    return Plan(out, need)


def parse_windows(models: Any, props: Any = None) -> dict[str, int]:
    """Model id -> context window, from a `/v1/models` answer (and llama-server's `/props`)."""
    out: dict[str, int] = {}
    n_ctx = None
    if isinstance(props, Mapping):  # llama-server: the context of one slot, what a request gets
        settings = props.get("default_generation_settings")
        got = settings.get("n_ctx") if isinstance(settings, Mapping) else None
        n_ctx = got if isinstance(got, int) and got > 0 else None
    data = models.get("data") if isinstance(models, Mapping) else None
    for m in data if isinstance(data, list) else ():
        if not isinstance(m, Mapping) or not isinstance(m.get("id"), str):
            continue
        meta = m.get("meta") if isinstance(m.get("meta"), Mapping) else {}
        for w in (m.get("max_model_len"), meta.get("n_ctx"), n_ctx, meta.get("n_ctx_train")):
            if isinstance(w, int) and not isinstance(w, bool) and w > 0:
                out[m["id"]] = w
                break
    return out


def _served_window(models: Any) -> bool:
    """Whether a /v1/models answer says the served window (not only the model's trained one)."""
    data = models.get("data") if isinstance(models, Mapping) else None
    return any(isinstance(m, Mapping) and ("max_model_len" in m or isinstance(m.get("meta"), Mapping)
                                           and "n_ctx" in m["meta"]) for m in data or ())


async def _get_json(replica: Replica, url: str, timeout: float) -> Any:
    async with replica.client().get(url, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False,
                                    auth=replica.auth) as resp:  # credentials of a user:pw@ URL
        if resp.status != 200:
            return None
        return orjson.loads(await resp.content.read(MAX_DISCOVERY_BYTES))


async def discover(replica: Replica, timeout: float) -> None:
    """Read the replica's context windows into `replica.windows` ({} when it reports none). Left
    None when the replica could not be asked, so that the next health check asks again."""
    try:
        models = await _get_json(replica, replica.url + "/models", timeout)
        props = None
        if models is not None and not _served_window(models):  # e.g. an older llama-server: its /props
            props = await _get_json(replica, replica.root + "/props", timeout)
    except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError, AttributeError) as e:
        log.debug("replica %s: context window not read: %s", replica.name, e)
        return
    replica.windows = parse_windows(models, props)
    if replica.windows:
        log.info("replica %s: context window %s", replica.name,
                 ", ".join(f"{m} {w}" for m, w in replica.windows.items()))
