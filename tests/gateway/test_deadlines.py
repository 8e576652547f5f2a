"""pools/deadlines.py: many deadlines on one loop timer (the connections' header and keep-alive
times, the upstream answers' total times) fire at or after their time, once, unless cleared or moved."""

from __future__ import annotations

import asyncio

from switchyard.pools.deadlines import Deadlines


async def test_deadlines_fire_in_time_once_and_not_when_cleared_or_moved() -> None:
    loop = asyncio.get_running_loop()
    d = Deadlines(loop, slack=0.005)
    fired: list[tuple[str, float]] = []
    t0 = loop.time()

    def mark(name: str):  # noqa: ANN202
        return lambda: fired.append((name, loop.time() - t0))

    d.set("late", t0 + 0.20, mark("late"))
    d.set("early", t0 + 0.05, mark("early"))  # before the armed time: the timer moves up
    d.set("cleared", t0 + 0.03, mark("cleared"))
    d.clear("cleared")
    d.set("moved", t0 + 0.04, mark("moved"))
    d.set("moved", t0 + 0.12, mark("moved"))  # set again: only the later time counts
    await asyncio.sleep(0.35)
    assert [n for n, _ in fired] == ["early", "moved", "late"]
    for (name, at), due in zip(fired, (0.05, 0.12, 0.20), strict=True):
        assert due <= at < due + 0.1, (name, at)
    assert len(d) == 0


async def test_a_callback_may_set_and_clear_and_a_failing_one_stops_no_other(caplog) -> None:
    loop = asyncio.get_running_loop()
    d = Deadlines(loop, slack=0.005)
    fired: list[str] = []
    t0 = loop.time()

    def first() -> None:
        fired.append("first")
        d.clear("second")  # due in the same sweep: cleared before its turn
        d.set("again", loop.time() + 0.3, lambda: fired.append("again"))

    def boom() -> None:
        raise RuntimeError("boom")

    d.set("first", t0 + 0.02, first)
    d.set("second", t0 + 0.02, lambda: fired.append("second"))
    d.set("boom", t0 + 0.02, boom)
    d.set("third", t0 + 0.05, lambda: fired.append("third"))  # earlier than the one the callback set
    await asyncio.sleep(0.15)
    assert fired == ["first", "third"]
    assert "a deadline's callback failed" in caplog.text
    await asyncio.sleep(0.3)
    assert fired == ["first", "third", "again"]
