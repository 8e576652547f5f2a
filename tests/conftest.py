"""Shared test setup: tests import process helpers from tests/procs.py; the markers are kept consistent here;
one engine serving SmolLM2 for the tests outside tests/engine (`smollm2_server`).

Markers (pyproject.toml): `slow` (many processes, or long), `engine` (torch and the SmolLM2
weights). `make test-fast` leaves both out; `make test` runs everything.
"""

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

# OpenMP workers that sleep as soon as they are idle, in this process and every engine it starts (set before
# anything imports torch; a value set by the user wins). `engine serve` keeps them spinning for 10M rounds
# (GOMP_SPINCOUNT, native/__init__.py): faster alone on a quiet machine, but the tests run an engine beside
# the test process, other engines, gateways and other people's work on 2 cores, and a spinning worker burns
# the core the others wait for. tests/engine/test_server.py -k "eight or chunked" (two engines at once), on
# the 2-core AMD EPYC at load ~5: 241 s and 430 s (184 s, 204 s CPU) spinning, 101 s (67 s CPU) with 0,
# 110 s with 1000. The engine tests that start two replicas already set 0 (test_engine_cache_aware.py).
os.environ.setdefault("GOMP_SPINCOUNT", "0")

# Fixtures that hand out the SmolLM2 weights (tests/engine/conftest.py, and smollm2_server below): a test
# that reaches them, directly or through another fixture, needs the engine wherever it lives.
ENGINE_FIXTURES = frozenset({"gguf_path", "server_tp1", "smollm2_server"})
# A real Chromium (tests/ui/uikit.py) is a dozen processes and seconds a page: `slow`.
BROWSER_FIXTURES = frozenset({"browser", "page"})

# The shared engine: the shipped int4 weights at the model's own 8,192-token window, as `switchyard up` serves
# them (they load faster than float32; the tests that compare float32 outputs live in tests/engine), a few
# sequences at once. Agent sessions' prompts carry ~3k tokens of tools; the Messages tests' policy keeps
# its own smaller window.
SMOLLM2_SERVER_ARGS = ["--served-model-name", "smollm2-135m", "--dtype", "int4", "--max-num-seqs", "4"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`engine` on every test under tests/engine/ (its conftest imports torch) and on every test
    that uses the weights' fixtures, so `-m "not engine"` never loads a model; `slow` on every
    test that drives a real browser."""
    engine_dir = TESTS / "engine"
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if not item.get_closest_marker("engine") and (
                engine_dir in Path(str(item.path)).parents or ENGINE_FIXTURES & fixtures):
            item.add_marker(pytest.mark.engine)
        if not item.get_closest_marker("slow") and BROWSER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def smollm2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator["EngineServer"]:  # noqa: F821
    """`switchyard engine serve` on SmolLM2 (int4, TP=1) for the session, shared by every test outside
    tests/engine that needs a real model behind the gateway (Messages and Responses through the SDKs,
    live replay and agent sessions, the LLM classifier): one start-up instead of one per module. Its `url`
    is the root."""
    sys.path.insert(0, str(TESTS / "engine"))
    from engine_support import EngineServer, smollm2_path

    s = EngineServer(smollm2_path(), tmp_path_factory.mktemp("smollm2") / "engine.log", extra=SMOLLM2_SERVER_ARGS)
    yield s
    s.close()
