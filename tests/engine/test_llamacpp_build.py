"""The llama.cpp build's locator: where the binaries are, or why they are missing and how to
build them (tests and benches skip with that message)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _where(home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SWITCHYARD_LLAMA_CPP": str(home)}
    return subprocess.run([sys.executable, "-m", "switchyard.llamacpp", "where"], capture_output=True, text=True,
                          env=env, timeout=60)


def test_missing_build_says_how_to_build(tmp_path: Path) -> None:
    proc = _where(tmp_path)
    assert proc.returncode == 1
    assert "11434.0.0 is not built" in proc.stderr and "make llama-cpp" in proc.stderr


def test_half_built_tree_names_what_it_lacks(tmp_path: Path) -> None:
    """A build folder marked finished but missing a binary (deleted, or an older target list)."""
    bins = tmp_path / "build" / "bin"
    bins.mkdir(parents=True)
    (tmp_path / "build" / ".switchyard-complete").touch()
    server = bins / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    proc = _where(tmp_path)
    assert proc.returncode == 1
    assert "lacks llama-bench, llama-batched-bench" in proc.stderr


def test_an_amx_cpu_builds_without_ggml_amx_kernels_in_a_folder_of_its_own(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """ggml-cpu's AMX kernels of this version die of SIGILL on an AMX Xeon; that build leaves them out."""
    from switchyard import llamacpp

    monkeypatch.delenv("SWITCHYARD_LLAMA_CPP", raising=False)
    monkeypatch.setattr(llamacpp, "_cpu_has_amx", lambda: True)
    opts = llamacpp.cmake_options()
    assert f"-DCMAKE_C_FLAGS={llamacpp.NO_AMX}" in opts and f"-DCMAKE_CXX_FLAGS={llamacpp.NO_AMX}" in opts
    assert llamacpp.home().name == "11434.0.0-no-amx"
    monkeypatch.setattr(llamacpp, "_cpu_has_amx", lambda: False)
    assert llamacpp.cmake_options() == llamacpp.CMAKE_OPTIONS and llamacpp.home().name == "11434.0.0"
