"""deploy/examples/ must be what `bash deploy/regenerate.sh` writes today."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from cluster_helpers import ROOT
from typer.testing import CliRunner

from switchyard.cli import app


def _commands() -> dict[str, list[str]]:
    """The plan commands of deploy/regenerate.sh, by example folder (minus --plot: PNGs are not compared)."""
    text = (ROOT / "deploy/regenerate.sh").read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        argv = shlex.split(line)
        if argv[:4] == ["python", "-m", "switchyard.cli", "plan"]:
            args = argv[4:]
            i = args.index("--plot")
            del args[i : i + 2]
            out[args[args.index("--emit") + 1]] = args
    return out


COMMANDS = _commands()


def _texts(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix != ".png"
    }


def test_regenerate_covers_both_examples():
    assert sorted(COMMANDS) == ["deploy/examples/ring4", "deploy/examples/spark8"]


@pytest.mark.parametrize("example", sorted(COMMANDS))
def test_examples_are_current(example, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands use paths relative to the repository root
    args = list(COMMANDS[example])
    out = tmp_path / "out"
    args[args.index("--emit") + 1] = str(out)
    res = CliRunner().invoke(app, ["plan", *args])
    assert res.exit_code == 0, res.output
    fresh, checked_in = _texts(out), _texts(ROOT / example)
    assert sorted(fresh) == sorted(checked_in), "file list differs: run `bash deploy/regenerate.sh`"
    for rel, text in fresh.items():
        assert text == checked_in[rel], f"{example}/{rel} is stale: run `bash deploy/regenerate.sh`"
    assert (ROOT / example / "capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
