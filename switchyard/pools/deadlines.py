"""Many deadlines on one event-loop timer: the connections' header, keep-alive and upstream timeouts.

A request sets and clears two or three deadlines (its client connection's header and keep-alive
times, its upstream answer's total time). As uvloop timers each was a `call_later` + `cancel`
pair, ~3 us warm on a 2-core AMD EPYC and several times that at c=1, where the caches are cold;
here each is a dict write. The one timer is armed for the earliest deadline and re-armed only when
a new deadline comes before it, so an idle gateway sweeps about once per keep-alive time, not on a
fixed tick. A deadline fires at or after its time: at most `slack` late, which bounds how often the
timer sweeps while deadlines keep moving.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Hashable

log = logging.getLogger("switchyard.deadlines")


class Deadlines:
    __slots__ = ("loop", "slack", "_due", "_timer", "_at")

    def __init__(self, loop: asyncio.AbstractEventLoop, slack: float = 0.02) -> None:
        self.loop = loop
        self.slack = slack
        self._due: dict[Hashable, tuple[float, Callable[[], None]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the timer fires (inf: not armed)

    def set(self, key: Hashable, when: float, callback: Callable[[], None]) -> None:
        """Call `callback` at loop time `when` unless `key` is cleared or set again first."""
        self._due[key] = (when, callback)
        if when < self._at:
            self._arm(when)

    def clear(self, key: Hashable) -> None:
        self._due.pop(key, None)

    def __len__(self) -> int:
        return len(self._due)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        when = max(when, self.loop.time() + self.slack)
        self._at = when
        self._timer = self.loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        self._timer, self._at = None, math.inf
        now = self.loop.time()
        due = [(k, entry) for k, entry in self._due.items() if entry[0] <= now]
        for key, entry in due:
            if self._due.get(key) is not entry:  # an earlier callback cleared or moved it
                continue
            del self._due[key]
            try:
                entry[1]()
            except Exception:  # as the loop's own timers: logged, the others still run
                log.exception("a deadline's callback failed")
        if self._due:  # a callback may have armed the timer for a later deadline than the rest's
            first = min(w for w, _ in self._due.values())
            if first < self._at:
                self._arm(first)
