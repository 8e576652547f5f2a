from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from switchyard.classify.bfcl import Case, load_cases
from switchyard.classify.model_file import read_meta
from switchyard.classify.split import Split
from switchyard.datasets import bfcl_zip

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "classifiers" / "tool-complexity.onnx"


@pytest.fixture(scope="session")
def bfcl_cases() -> list[Case]:
    with bfcl_zip() as zf:
        return load_cases(zf)


@pytest.fixture(scope="session")
def shipped_split() -> Split:
    """The split the shipped model was trained with, rebuilt from its sidecar."""
    return Split.from_record(read_meta(SHIPPED).trained["split"])


@pytest.fixture
def model_copy(tmp_path: Path) -> Path:
    """The shipped model pair copied into tmp_path, free to damage."""
    dst = tmp_path / "m.onnx"
    shutil.copy(SHIPPED, dst)
    shutil.copy(SHIPPED.with_suffix(".json"), dst.with_suffix(".json"))
    return dst
