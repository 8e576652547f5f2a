"""engine/affinity.py (--pin-cpus on): the layout a GPU replica's loop thread and grammar fill process take, and the
scheduler's loop pinning its thread for its run. The pinned fill process itself: test_grammar_process's
test_a_fill_process_given_cpus_runs_on_them and test_async_decode's grammar rows (through the scheduler)."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest

from switchyard.engine import affinity
from switchyard.engine.runner.options import EngineOptions


def test_the_loop_takes_a_core_and_the_fill_process_one_thread_of_each_other() -> None:
    ht = {c: {c % 4, c % 4 + 4} for c in range(8)}  # four cores of two hyperthreads: cpu c beside c + 4
    assert affinity.pinned_layout(set(range(8)), ht.__getitem__) == affinity.Layout(0, [1, 2, 3])
    assert affinity.pinned_layout({2, 3, 5, 6, 7}, ht.__getitem__) == affinity.Layout(2, [3, 5])  # its CPUs only
    assert affinity.pinned_layout({0, 4, 1, 5}, ht.__getitem__) is None  # two cores: nothing to gain
    assert affinity.pinned_layout({0, 1, 2}, lambda c: {c}) == affinity.Layout(0, [1, 2])
    assert affinity.cpu_siblings(min(os.sched_getaffinity(0))) >= {min(os.sched_getaffinity(0))}  # this machine's


def test_pin_cpus_is_an_option_of_a_gpu_replica_of_one_rank() -> None:
    from switchyard.engine.errors import ConfigError

    def opts(**kw: object) -> EngineOptions:
        return EngineOptions(model_path="m.gguf", **kw)  # type: ignore[arg-type]

    assert opts(device="cuda", pin_cpus="on").pins_cpus
    assert not opts(device="cuda").pins_cpus  # off unless asked: replicas sharing a host would share its first core
    for bad in ({"device": "cpu"}, {"device": "cuda", "tp": 2}):
        with pytest.raises(ConfigError, match="--pin-cpus on is for a GPU replica of one rank"):
            opts(pin_cpus="on", **bad)
    with pytest.raises(ConfigError, match="--pin-cpus must be one of off, on"):
        opts(pin_cpus="auto")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_loop_runs_pinned_and_gives_its_cpus_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scheduler.loop under pins_cpus: its thread on the layout's CPU while it runs (seen at its STOP signal), the
    fill CPUs handed to the output stage, the thread's CPUs as before once it returns."""
    from switchyard.engine.core.scheduler import Scheduler
    from switchyard.engine.runner.broadcast import STOP

    first, *rest = sorted(os.sched_getaffinity(0))
    monkeypatch.setattr(affinity, "pinned_layout", lambda cpus: affinity.Layout(first, rest))
    seen: list[object] = []
    runner = SimpleNamespace(opts=SimpleNamespace(pins_cpus=True, fill_threads=1, fill_process=False),
                             chunked_prefill=False, num_kv_blocks=64, world=1,
                             signal=lambda what: seen.append((what, os.sched_getaffinity(0))))
    sched = Scheduler(runner, None, 2, 64)  # type: ignore[arg-type]
    before: list[set[int]] = []

    def run() -> None:
        before.append(os.sched_getaffinity(0))
        sched.stop()
        sched.loop()
        seen.append(os.sched_getaffinity(0))

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert seen == [(STOP, {first}), before[0]]
    assert sched.output.fill_cpus == rest and sched.pinned == affinity.Layout(first, rest)  # /health's cpus


def test_engine_serve_refuses_pin_cpus_on_a_cpu(tmp_path: object) -> None:
    """The flag as `switchyard engine serve` takes it: a clear usage error where it cannot hold, before any load."""
    from typer.testing import CliRunner

    from switchyard.engine.serving.cli import engine_app

    r = CliRunner().invoke(engine_app, ["--model", str(tmp_path), "--pin-cpus", "on"], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "--pin-cpus on is for a GPU replica of one rank" in r.output, r.output
    r = CliRunner().invoke(engine_app, ["--model", str(tmp_path), "--pin-cpus", "yes"], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "--pin-cpus must be one of off, on" in r.output, r.output
