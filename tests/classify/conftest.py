"""Fixtures for tests/classify live in classifykit.py (a unique module name: test files import helpers from it)."""

from classifykit import *  # noqa: F403
