"""Engine test fixtures: the real SmolLM2 file and one shared TP=1 server per session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton decode kernels run in Triton's interpreter. The variable is read when
# a Triton function is defined, Triton's own library included, so it is set before anything
# imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_support import SERVER_ARGS, EngineServer, smollm2_path  # noqa: E402


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return smollm2_path()


@pytest.fixture(scope="session")
def server_tp1(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    s = EngineServer(gguf_path, tmp_path_factory.mktemp("tp1") / "engine.log", tp=1, extra=SERVER_ARGS)
    yield s
    s.close()
