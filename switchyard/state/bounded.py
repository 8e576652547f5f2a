"""A bounded store of entries grouped by owner (the caller, an API key id): what an in-memory
StateStore keeps per caller, so that one caller's traffic can never push out another's state.

Bounds: entries per owner (an owner over its cap loses its own oldest) and a total weight (entries,
or bytes); at the total, the owner holding the most weight loses its oldest, so an owner below
its fair share is never touched while another holds more.

Values should be objects the cyclic GC does not track (bytes, str, tuples of atomic values): a
gateway holds hundreds of thousands of them, and a full collection walks every tracked object.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")

_RESCAN = 64  # evictions between two searches for the heaviest owner (a scan is O(owners))


class OwnedLRU(Generic[V]):
    def __init__(self, per_owner: int, total: int, weigh: Callable[[V], int] | None = None):
        if per_owner < 1 or total < 1:
            raise ValueError("bounds must be >= 1")
        self.per_owner = per_owner
        self.total = total
        self._weigh = weigh  # None: every entry weighs 1
        self._owners: dict[str, OrderedDict[str, V]] = {}
        self._weights: dict[str, int] = {}  # owner -> weight held (== entries when weigh is None)
        self.weight = 0
        self.evicted = 0
        self._victim: str | None = None
        self._since_scan = 0

    def __len__(self) -> int:
        return sum(len(od) for od in self._owners.values())

    def owners(self) -> dict[str, int]:
        """owner -> entries held."""
        return {o: len(od) for o, od in self._owners.items()}

    def get(self, owner: str, key: str) -> V | None:
        od = self._owners.get(owner)
        return None if od is None else od.get(key)

    def put(self, owner: str, key: str, value: V) -> None:
        od = self._owners.get(owner)
        if od is None:
            od = self._owners[owner] = OrderedDict()
            self._weights[owner] = 0
        w = 1 if self._weigh is None else self._weigh(value)
        old = od.get(key)
        if old is not None:
            w -= 1 if self._weigh is None else self._weigh(old)
            od.move_to_end(key)
        od[key] = value
        self._weights[owner] += w
        self.weight += w
        while len(od) > self.per_owner:
            self._pop_oldest(owner)
        while self.weight > self.total and self._weights:
            self._pop_oldest(self._heaviest())

    def pop(self, owner: str, key: str) -> V | None:
        od = self._owners.get(owner)
        if od is None:
            return None
        v = od.pop(key, None)
        if v is not None:
            self._lose(owner, v)
        return v

    def oldest(self, owner: str) -> tuple[str, V] | None:
        od = self._owners.get(owner)
        if not od:
            return None
        k = next(iter(od))
        return k, od[k]

    def newest(self) -> Iterator[tuple[str, V]]:
        """Every entry, each owner's newest first (owners in no particular order)."""
        for od in list(self._owners.values()):
            yield from reversed(list(od.items()))

    def _pop_oldest(self, owner: str) -> None:
        _, v = self._owners[owner].popitem(last=False)
        self.evicted += 1
        self._lose(owner, v)

    def _lose(self, owner: str, v: V) -> None:
        w = 1 if self._weigh is None else self._weigh(v)
        self._weights[owner] -= w
        self.weight -= w
        if not self._owners[owner]:
            del self._owners[owner]
            del self._weights[owner]
            if self._victim == owner:
                self._victim = None

    def _heaviest(self) -> str:
        self._since_scan += 1
        if self._victim is None or self._since_scan >= _RESCAN:
            self._victim = max(self._weights, key=self._weights.__getitem__)
            self._since_scan = 0
        return self._victim
