"""The paged KV cache's block pool: tables, refcounts, prefix keys, LRU eviction."""

from __future__ import annotations

import random

import pytest

from switchyard.engine.core.kv_blocks import BlockPool, SeqBlocks, prefix_keys


def _run(pool: BlockPool, tokens: list[int]) -> SeqBlocks:
    """Admit a sequence, give it blocks for all its tokens, mark them computed."""
    s = SeqBlocks()
    assert pool.admit(s, tokens) is not None  # blocks for every token
    assert len(s.table) == pool.blocks_for(len(tokens))
    pool.commit(s, lambda a, b: tokens[a:b], len(tokens))
    pool.check()
    return s


def test_keys_chain_the_whole_prefix() -> None:
    a = list(range(40))
    b = [99] + a[1:]
    ka, kb = prefix_keys(a, 16), prefix_keys(b, 16)
    assert len(ka) == 2  # full blocks only
    assert ka[1] != kb[1]  # same tokens in block 1, different parent: different key
    assert prefix_keys(a[:32], 16) == ka and prefix_keys(a, 16, limit=31) == ka[:1]


def test_longest_cached_run_and_the_last_token_is_always_computed() -> None:
    pool = BlockPool(16, 4)
    first = _run(pool, list(range(10)))  # blocks 0-1 full, 2 partial
    assert len(first.table) == 3 and len(first.keys) == 2 and pool.num_cached == 2
    again = SeqBlocks()
    assert pool.admit(again, list(range(10)) + [77]) == 8  # both full blocks
    assert again.table[:2] == first.table[:2] and len(again.table) == 3  # + a block of its own for the rest
    exact = SeqBlocks()
    # 8 tokens = exactly the two cached blocks; the last token must be computed, so only one is served.
    assert pool.admit(exact, list(range(8))) == 4
    other = SeqBlocks()
    assert pool.admit(other, [0, 1, 2, 9, 4, 5, 6, 7, 8]) == 0  # differs inside block 0
    assert pool.queries == 10 + 11 + 8 + 9 and pool.hits == 8 + 4
    pool.check()


def test_shared_blocks_are_refcounted_and_freed_blocks_stay_cached() -> None:
    pool = BlockPool(6, 4)
    a = _run(pool, list(range(12)) + [1])  # 4 blocks: 3 full, 1 partial
    b = SeqBlocks()
    assert pool.admit(b, list(range(12)) + [2]) == 12
    assert pool.grow(b, 13) and pool.num_free == 1  # a's 4 + b's own last block
    pool.free(a)
    pool.check()
    assert pool.num_free == 2  # a's private last block + the untouched one; the shared three are b's too
    pool.free(b)
    pool.check()
    assert pool.num_free == 6 and pool.num_cached == 3 and pool.usage == 0.0
    c = SeqBlocks()
    assert pool.admit(c, list(range(12)) + [3]) == 12  # still cached after every holder left


def test_uncached_blocks_go_first_then_least_recently_freed() -> None:
    pool = BlockPool(4, 2)
    old = _run(pool, [1, 2, 3])  # one full block (cached) + a partial one
    new = _run(pool, [5, 6, 7])
    pool.free(old)
    pool.free(new)
    x = SeqBlocks()
    assert pool.grow(x, 2) and pool.evictions == 0  # an uncached free block first
    assert pool.grow(x, 4) and pool.evictions == 0
    assert pool.grow(x, 6) and pool.evictions == 1  # now the least recently freed cached block: old's
    assert pool.cached_prefix([1, 2, 3]) == 0 and pool.cached_prefix([5, 6, 7]) == 2
    pool.check()


def test_admission_and_growth_take_nothing_when_short_and_held_blocks_are_never_evicted() -> None:
    pool = BlockPool(4, 4)
    a = _run(pool, list(range(9)))  # 3 blocks: 2 full and cached, 1 partial
    b = SeqBlocks()
    assert pool.admit(b, list(range(8)) + [50, 51, 52, 53, 54]) is None  # its 2 hits + 2 new > 1 free
    assert b.table == [] and pool.hits == 0
    assert pool.admit(b, list(range(8)) + [50, 51, 52, 53, 54], step=4) == 8  # the first step: 1 new block
    assert len(b.table) == 3 and pool.num_free == 0
    assert not pool.grow(b, 13)  # every block is held: nothing to evict
    assert len(b.table) == 3 and pool.evictions == 0
    pool.free(a)
    assert pool.grow(b, 13) and pool.evictions == 0  # a's private last block, uncached
    pool.check()


def test_caching_off_computes_everything() -> None:
    pool = BlockPool(8, 4, prefix_caching=False)
    a = _run(pool, list(range(9)))
    pool.free(a)
    s = SeqBlocks()
    assert pool.admit(s, list(range(9))) == 0 and pool.num_cached == 0 and pool.hits == 0


def test_pool_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0, 16)


def test_random_workload_never_serves_another_prefix() -> None:
    """Sequences drawn from a few shared prefixes come and go on a small pool; a fake cache
    records which token each block position holds, written only through the tables. Every
    live sequence always reads its own tokens back, through hits, sharing and evictions."""
    rng = random.Random(7)
    bs = 4
    pool = BlockPool(24, bs)
    cache: dict[tuple[int, int], int] = {}
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
    live: list[tuple[SeqBlocks, list[int], int]] = []  # (blocks, tokens, computed)

    def verify(s: SeqBlocks, toks: list[int], computed: int) -> None:
        for p in range(computed):
            assert cache[(s.table[p // bs], p % bs)] == toks[p]

    for _ in range(600):
        op = rng.random()
        if op < 0.35 or not live:
            toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
            s = SeqBlocks()
            step = rng.randrange(0, 9)
            computed = pool.admit(s, toks, step)
            if computed is None:
                assert s.table == []
                continue
            verify(s, toks, computed)
            n = len(toks) if step == 0 else min(len(toks), computed + step)
            assert len(s.table) == pool.blocks_for(n)
            live.append((s, toks, computed))
        elif op < 0.85:
            i = rng.randrange(len(live))
            s, toks, computed = live[i]
            if computed == len(toks):
                toks = toks + [rng.randrange(50)]  # a decode step adds a token
            n = min(len(toks), computed + rng.randrange(1, 9))
            if pool.grow(s, n):
                for p in range(computed, n):  # the step writes positions computed..n-1
                    blk = s.table[p // bs]
                    held_by = sum(blk in o.table for o, _, _ in live)
                    assert held_by == 1, "a shared block was written"
                    cache[(blk, p % bs)] = toks[p]
                pool.commit(s, lambda a, b, t=toks: t[a:b], n)
                live[i] = (s, toks, n)
            else:  # out of blocks: the scheduler would preempt; here the sequence just leaves
                pool.free(s)
                live.pop(i)
        else:
            s, _, _ = live.pop(rng.randrange(len(live)))
            pool.free(s)
        pool.check()
        for s, toks, computed in live:
            verify(s, toks, computed)
    assert pool.hits > 0 and pool.evictions > 0
