"""Fixtures for the cluster tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_helpers import ROOT


@pytest.fixture
def root() -> Path:
    return ROOT
