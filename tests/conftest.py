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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`engine` on every test under tests/engine/ (its conftest imports torch) and on every test
    that uses the weights' fixtures, so `-m "not engine"` never loads a model."""
    engine_dir = TESTS / "engine"
    for item in items:
        if item.get_closest_marker("engine"):
            continue
        if engine_dir in Path(str(item.path)).parents or ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
