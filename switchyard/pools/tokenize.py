"""Count a prompt's tokens with a pool's own tokenizer (Anthropic's /v1/messages/count_tokens).

Asks one available replica's `POST {root}/tokenize`: first with the chat request
(`{"messages", "tools"}`: our engine and vLLM apply the model's chat template, so the count is
the prompt's), else with its text (`{"content": text}`: llama-server's form, the template's own
tokens left out). None when no replica answers either within the timeout: the caller then
states an estimate.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson

from switchyard.pools.pool import Pool
from switchyard.pools.replica import Replica

TIMEOUT = aiohttp.ClientTimeout(total=2.0)


async def _tokens(pool: Pool, replica: Replica, body: dict[str, Any]) -> int | None:
    try:
        async with replica.client().post(
            replica.root + "/tokenize", data=orjson.dumps(body), headers=pool.upstream_headers,
            timeout=TIMEOUT, allow_redirects=False, auth=replica.auth,
        ) as resp:
            if resp.status != 200:
                return None
            data = orjson.loads(await resp.content.read(16 * 1024 * 1024))
    except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError):
        return None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    # An empty list for a non-empty request is a server that did not understand the form.
    return len(tokens) if isinstance(tokens, list) and tokens else None


async def count_tokens(pool: Pool, chat: dict[str, Any], text: str) -> tuple[int, str] | None:
    """(tokens, "chat template" | "text") by the pool's tokenizer, or None."""
    now = time.monotonic()
    replica = next((r for r in pool.replicas if r.available(now)), None)
    if replica is None:
        return None
    body: dict[str, Any] = {"model": pool.model, "messages": chat.get("messages") or []}  # vLLM wants the model
    if chat.get("tools"):
        body["tools"] = chat["tools"]
    n = await _tokens(pool, replica, body)
    if n is not None:
        return n, "chat template"
    n = await _tokens(pool, replica, {"content": text})
    return None if n is None else (n, "text")
