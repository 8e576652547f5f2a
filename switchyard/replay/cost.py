"""What a replay run cost, and what the same cases would have cost on the large pool alone.

Each case is priced at the `price` of the pool that served it (or, live, at what the gateway
said in `x-switchyard-cost-usd`), and at the large pool's price: with the large pool's own
saved outcome for the case when there is one (a counterfactual from outcomes of both pools:
exactly what large-only would have spent), else with the case's own tokens (live and
single-pool runs: the same tokens at the large pool's price, an estimate that holds the
answer's length fixed). Pools without a price leave their cases unpriced.
"""

from __future__ import annotations

from collections.abc import Callable

from switchyard.policy.schema import PolicySpec
from switchyard.replay.results import CaseResult, RunResult

Tokens = tuple[int, int, int]  # prompt (cached included), completion, cached


def _tokens(r: CaseResult) -> Tokens | None:
    if r.prompt_tokens is None and r.completion_tokens is None:
        return None
    return r.prompt_tokens or 0, r.completion_tokens or 0, r.cached_tokens or 0


def outcome_tokens(o: dict | None) -> Tokens | None:
    """A saved outcome's tokens (None when it has none)."""
    if o is None or (o.get("prompt_tokens") is None and o.get("completion_tokens") is None):
        return None
    return int(o.get("prompt_tokens") or 0), int(o.get("completion_tokens") or 0), int(o.get("cached_tokens") or 0)


def price_run(run: RunResult, spec: PolicySpec,
              large_tokens: Callable[[str], Tokens | None] | None = None) -> None:
    """Fill each case's cost_usd and large_cost_usd; a note says how large-only was priced."""
    large = spec.pools.get(run.large_pool)
    lprice = large.price if large is not None else None
    exact = estimated = 0
    for r in run.results:
        own = _tokens(r)
        if own is None or r.pool is None:
            continue
        pool = spec.pools.get(r.pool)
        if r.cost_usd is None and pool is not None and pool.price is not None:
            r.cost_usd = pool.price.cost(*own)
        if lprice is not None:
            theirs = large_tokens(r.id) if large_tokens is not None and r.pool != run.large_pool else None
            if theirs is not None:
                exact += 1
            elif r.pool != run.large_pool:
                estimated += 1
            r.large_cost_usd = lprice.cost(*(theirs or own))
    if lprice is None:
        if any(r.cost_usd is not None for r in run.results):
            run.notes.append(f"pool {run.large_pool!r} has no price: no large-only cost to compare with")
    elif estimated:
        run.notes.append(f"large-only cost: {estimated} cases not served by {run.large_pool!r} priced with their own "
                         f"tokens at its price" + (f" ({exact} from its saved outcomes)" if exact else ""))
