"""Count a prompt's tokens with a pool's own tokenizer (Anthropic's /v1/messages/count_tokens).

Asks one available replica `POST {root}/tokenize {"content": text}`, the endpoint llama-server
has and our engine serves alike (`{"tokens": [...]}`); None when it has none, or does not answer
within the timeout: the caller then states an estimate.
"""

from __future__ import annotations

import time

import aiohttp
import orjson

from switchyard.pools.pool import Pool

TIMEOUT = aiohttp.ClientTimeout(total=2.0)


async def count_tokens(pool: Pool, text: str) -> int | None:
    now = time.monotonic()
    replica = next((r for r in pool.replicas if r.available(now)), None)
    if replica is None:
        return None
    try:
        async with replica.client().post(
            replica.root + "/tokenize", data=orjson.dumps({"content": text}), headers=pool.upstream_headers,
            timeout=TIMEOUT, allow_redirects=False, auth=replica.auth,
        ) as resp:
            if resp.status != 200:
                return None
            data = orjson.loads(await resp.content.read(16 * 1024 * 1024))
    except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError):
        return None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    return len(tokens) if isinstance(tokens, list) else None
