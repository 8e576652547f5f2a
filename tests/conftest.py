"""Shared test setup: tests import process helpers from tests/procs.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
