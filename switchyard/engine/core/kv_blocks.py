"""Rank 0's bookkeeping for the paged KV cache: a pool of fixed-size blocks, each sequence's
block table, and automatic prefix caching.

The cache itself (one tensor of blocks per layer, per rank) lives in the model; this module
only decides which block holds which positions, and every rank receives the resulting tables
with each step. A full block is keyed by a hash of its tokens chained with its parent
block's key, so a key names the whole prefix up to the block's end: a new sequence reuses the
longest run of its leading blocks whose keys are cached and computes only the rest. Blocks
are refcounted (sequences with a common prefix share them) and a freed block keeps its
contents and key until the pool needs the space: uncached free blocks are handed out first,
then cached ones, least recently freed first.

A block is written only while its sequence holds it alone: keys are given to full blocks,
which are never written again, and a sequence whose whole prompt is cached still computes its
last token into a block of its own. So sharing never needs copy-on-write.
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT_KEY = b"switchyard-kv"  # the parent key of a sequence's first block

Tokens = Callable[[int, int], list[int]]  # tokens[a:b] of a sequence, without copying all of them


def block_key(parent: bytes, tokens: list[int]) -> bytes:
    """The key of a full block: its tokens chained with the key of the block before it. SHA-256,
    not Python's hash(): a collision would silently serve one prompt's cache to another."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


def prefix_keys(tokens: list[int], block_size: int, limit: int | None = None) -> list[bytes]:
    """The keys of the full blocks among tokens[:limit]."""
    n = len(tokens) if limit is None else min(limit, len(tokens))
    keys, parent = [], ROOT_KEY
    for start in range(0, n - block_size + 1, block_size):
        parent = block_key(parent, tokens[start:start + block_size])
        keys.append(parent)
    return keys


@dataclass
class SeqBlocks:
    """One sequence's share of the pool."""

    table: list[int] = field(default_factory=list)  # block ids, in order of position
    keys: list[bytes] = field(default_factory=list)  # keys of table[:len(keys)]: full blocks, hashed


@dataclass
class _Block:
    refs: int = 0
    key: bytes | None = None  # set while the block is in the prefix cache


class BlockPool:
    """`num_blocks` blocks of `block_size` positions. Not thread-safe: the scheduler's thread
    owns it (the HTTP thread reads the counters only)."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a KV pool needs at least one block of at least one position, got "
                             f"{num_blocks} x {block_size}")
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        self._blocks = [_Block() for _ in range(num_blocks)]
        self._free_plain: list[int] = list(range(num_blocks - 1, -1, -1))  # popped from the end: 0 first
        self._free_cached: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU first
        self._cached: dict[bytes, int] = {}
        # Prompt tokens looked up and found at admission (vLLM's prefix_cache_queries / _hits).
        self.queries = self.hits = 0
        self.evictions = 0

    # -- state ------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks a sequence could get now: unused ones and cached ones nobody holds."""
        return len(self._free_plain) + len(self._free_cached)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Share of blocks held by sequences (vLLM's kv_cache_usage_perc: cached free blocks are free)."""
        return 1.0 - self.num_free / self.num_blocks

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # -- a sequence's life ------------------------------------------------------------------

    def admit(self, seq: SeqBlocks, tokens: list[int], step: int = 0, count: bool = True) -> int | None:
        """Give a sequence with no blocks the longest cached run of its leading full blocks, and
        blocks for its first step: `step` more tokens (0: all of them). Returns how many tokens
        the cache covers, or None, with nothing taken, when the pool is short. The last token is
        never served from the cache (its logits are needed), so at most the full blocks of
        tokens[:-1] are. `count`: add the lookup to the hit-rate counters (not for a preempted
        sequence coming back)."""
        assert not seq.table, "admit() is for a sequence without blocks"
        hit, keys = self._match(tokens)
        cached = len(hit) * self.block_size
        first = len(tokens) if step <= 0 else min(len(tokens), cached + step)
        idle_hits = sum(1 for b in hit if self._blocks[b].refs == 0)  # free now, held once admitted
        if self.blocks_for(first) - len(hit) > self.num_free - idle_hits:
            return None
        for b in hit:
            self._hold(b)
        seq.table, seq.keys = hit, keys
        self.grow(seq, first)
        if count:
            self.queries += len(tokens)
            self.hits += cached
        return cached

    def cached_prefix(self, tokens: list[int]) -> int:
        """How many of tokens' leading positions admit() would serve from the cache now."""
        return len(self._match(tokens)[0]) * self.block_size

    def _match(self, tokens: list[int]) -> tuple[list[int], list[bytes]]:
        hit: list[int] = []
        keys: list[bytes] = []
        if self.prefix_caching:
            for key in prefix_keys(tokens, self.block_size, len(tokens) - 1):
                b = self._cached.get(key)
                if b is None:
                    break
                hit.append(b)
                keys.append(key)
        return hit, keys

    def grow(self, seq: SeqBlocks, tokens: int) -> bool:
        """Make seq's table cover `tokens` positions. False, with nothing taken, when the pool
        has too few free blocks."""
        need = self.blocks_for(tokens) - len(seq.table)
        if need <= 0:
            return True
        if need > self.num_free:
            return False
        seq.table.extend(self._take() for _ in range(need))
        return True

    def commit(self, seq: SeqBlocks, tokens: Tokens, computed: int) -> None:
        """Key and cache the blocks that `computed` (positions now in the cache) has filled."""
        if not self.prefix_caching:
            return
        bs = self.block_size
        for i in range(len(seq.keys), min(computed // bs, len(seq.table))):
            key = block_key(seq.keys[-1] if seq.keys else ROOT_KEY, tokens(i * bs, (i + 1) * bs))
            seq.keys.append(key)
            b = seq.table[i]
            # Two sequences that computed the same prefix at once: the first block stays cached,
            # the other stays private and is freed as usual.
            if key not in self._cached and self._blocks[b].key is None:
                self._cached[key] = b
                self._blocks[b].key = key

    def free(self, seq: SeqBlocks) -> None:
        """Drop seq's hold on its blocks, last block first: a prefix's tail is less likely to be
        shared than its head, so it is evicted first."""
        for b in reversed(seq.table):
            blk = self._blocks[b]
            blk.refs -= 1
            if blk.refs == 0:
                if blk.key is not None:
                    self._free_cached[b] = None
                else:
                    self._free_plain.append(b)
        seq.table, seq.keys = [], []

    # -- blocks -----------------------------------------------------------------------------

    def _hold(self, b: int) -> None:
        blk = self._blocks[b]
        if blk.refs == 0:
            del self._free_cached[b]
        blk.refs += 1

    def _take(self) -> int:
        if self._free_plain:
            b = self._free_plain.pop()
        else:
            b, _ = self._free_cached.popitem(last=False)  # evict the least recently freed
            blk = self._blocks[b]
            assert blk.key is not None
            del self._cached[blk.key]
            blk.key = None
            self.evictions += 1
        self._blocks[b].refs = 1
        return b

    def check(self) -> None:
        """Internal consistency (the tests call it after every operation)."""
        free = set(self._free_plain) | set(self._free_cached)
        assert len(free) == len(self._free_plain) + len(self._free_cached), "a block is free twice"
        for i, blk in enumerate(self._blocks):
            assert blk.refs >= 0
            assert (blk.refs == 0) == (i in free), f"block {i}: refs {blk.refs}, free {i in free}"
            if blk.key is not None:
                assert self._cached[blk.key] == i
            if i in self._free_cached:
                assert blk.key is not None
        assert all(self._blocks[b].key == k for k, b in self._cached.items())
