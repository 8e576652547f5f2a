"""Shared test setup: tests import process helpers from tests/procs.py; the markers are kept consistent here.

Markers (pyproject.toml): `slow` (many processes, or long), `engine` (torch and the SmolLM2
weights). `make test-fast` leaves both out; `make test` runs everything.
"""

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

# Fixtures that hand out the SmolLM2 weights (tests/engine/conftest.py): a test that reaches them,
# directly or through another fixture, needs the engine wherever it lives.
ENGINE_FIXTURES = frozenset({"gguf_path", "server_tp1"})
# A real Chromium (tests/ui/uikit.py) is a dozen processes and seconds a page: `slow`.
BROWSER_FIXTURES = frozenset({"browser", "page"})


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
