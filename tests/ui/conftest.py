"""Fixtures for tests/ui live in uikit.py (a unique module name: test files import helpers from it)."""

from uikit import *  # noqa: F403
