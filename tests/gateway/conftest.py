"""Fixtures for tests/gateway live in gwkit.py (a unique module name: test files import helpers from it)."""

from gwkit import *  # noqa: F403
