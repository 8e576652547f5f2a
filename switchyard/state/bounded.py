"""A bounded store of entries grouped by owner (the caller, an API key id): what an in-memory
StateStore keeps per caller, so that one caller's traffic can never push out another's state.

Bounds: entries per owner (an owner over its cap loses its own oldest) and a total weight (entries,
or bytes); at the total, the owner holding the most weight loses its oldest, so an owner below
its fair share is never touched while another holds more.

Built for hundreds of thousands of entries next to a latency-sensitive event loop: every table is
a plain dict of atomic keys and values, which CPython leaves out of the cyclic GC altogether (an
OrderedDict, or any tracked container, is walked entry by entry on every full collection: ~80 ms
of CPU for 1M sessions, issue #34). Recency is kept in buckets: each owner's puts go, a bucket's
worth at a time, into numbered key sets (plain dicts of key -> None), the value carrying its
bucket's number (`bucket_of` reads it back); the oldest bucket goes first, newest-in-it first,
so eviction is in put order to within one bucket (at most 1/64 of the owner's cap, <= 1024 puts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")

_RESCAN = 64  # evictions between two searches for the heaviest owner (a scan is O(owners))


class _Owner(Generic[V]):
    __slots__ = ("data", "buckets", "cur", "filled", "weight")

    def __init__(self) -> None:
        self.data: dict[str, V] = {}  # key -> value (its bucket's number inside)
        self.buckets: dict[int, dict[str, None]] = {}  # bucket number -> its keys, oldest bucket first
        self.cur = 0  # the bucket puts go to
        self.filled = 0  # puts into it so far
        self.weight = 0


class OwnedLRU(Generic[V]):
    def __init__(self, per_owner: int, total: int, bucket_of: Callable[[V], int],
                 weigh: Callable[[V], int] | None = None):
        if per_owner < 1 or total < 1:
            raise ValueError("bounds must be >= 1")
        self.per_owner = per_owner
        self.total = total
        self.bucket_size = max(1, min(1024, per_owner // 64))
        self._bucket_of = bucket_of
        self._weigh = weigh  # None: every entry weighs 1
        self._owners: dict[str, _Owner[V]] = {}
        self.weight = 0
        self.evicted = 0
        self._victim: str | None = None
        self._since_scan = 0

    def __len__(self) -> int:
        return sum(len(o.data) for o in self._owners.values())

    def owners(self) -> dict[str, int]:
        """owner -> entries held."""
        return {name: len(o.data) for name, o in self._owners.items()}

    def bucket(self, owner: str) -> int:
        """The bucket number the owner's next put must carry in its value."""
        o = self._owners.get(owner)
        if o is None:
            return 0
        return o.cur + 1 if o.filled >= self.bucket_size else o.cur

    def get(self, owner: str, key: str) -> V | None:
        o = self._owners.get(owner)
        return None if o is None else o.data.get(key)

    def put(self, owner: str, key: str, value: V) -> None:
        """Keep `value` (made with bucket(owner) inside) as the owner's newest entry."""
        o = self._owners.get(owner)
        if o is None:
            o = self._owners[owner] = _Owner()
        w = 1 if self._weigh is None else self._weigh(value)
        old = o.data.get(key)
        if old is not None:
            self._unlink(o, key, old)
            w -= 1 if self._weigh is None else self._weigh(old)
        b = self._bucket_of(value)
        if b != o.cur:
            # The bucket left behind may have been emptied by the unlink above (a key put again):
            # an empty bucket at the front would be taken for the oldest.
            if not o.buckets.get(o.cur, True):
                del o.buckets[o.cur]
            o.cur, o.filled = b, 0
        keys = o.buckets.get(b)
        if keys is None:
            keys = o.buckets[b] = {}
        keys[key] = None
        o.filled += 1
        o.data[key] = value
        o.weight += w
        self.weight += w
        while len(o.data) > self.per_owner:
            self._pop_oldest(owner)
        while self.weight > self.total and self._owners:
            self._pop_oldest(self._heaviest())

    def pop(self, owner: str, key: str) -> V | None:
        o = self._owners.get(owner)
        if o is None:
            return None
        v = o.data.pop(key, None)
        if v is not None:
            self._unlink(o, key, v)
            self._lose(owner, o, v)
        return v

    def oldest(self, owner: str) -> tuple[str, V] | None:
        """The entry eviction would take next (of the owner's oldest bucket, its newest)."""
        o = self._owners.get(owner)
        if o is None or not o.buckets:
            return None
        keys = o.buckets[next(iter(o.buckets))]
        k = next(reversed(keys))
        return k, o.data[k]

    def newest(self) -> Iterator[tuple[str, V]]:
        """Every entry, each owner's newest first (owners in no particular order)."""
        for o in list(self._owners.values()):
            for b in reversed(list(o.buckets)):
                for k in reversed(list(o.buckets.get(b, ()))):
                    v = o.data.get(k)
                    if v is not None:
                        yield k, v

    def _unlink(self, o: _Owner[V], key: str, v: V) -> None:
        b = self._bucket_of(v)
        keys = o.buckets[b]
        del keys[key]
        if not keys and b != o.cur:
            del o.buckets[b]

    def _pop_oldest(self, owner: str) -> None:
        o = self._owners[owner]
        b = next(iter(o.buckets))
        keys = o.buckets[b]
        k, _ = keys.popitem()  # newest of the oldest bucket: O(1), where the first would be a scan
        if not keys:
            del o.buckets[b]
        v = o.data.pop(k)
        self.evicted += 1
        self._lose(owner, o, v)

    def _lose(self, owner: str, o: _Owner[V], v: V) -> None:
        w = 1 if self._weigh is None else self._weigh(v)
        o.weight -= w
        self.weight -= w
        if not o.data:
            del self._owners[owner]
            if self._victim == owner:
                self._victim = None

    def _heaviest(self) -> str:
        self._since_scan += 1
        if self._victim is None or self._since_scan >= _RESCAN:
            self._victim = max(self._owners, key=lambda n: self._owners[n].weight)
            self._since_scan = 0
        return self._victim
