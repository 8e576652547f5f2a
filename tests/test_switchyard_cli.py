"""The `switchyard` command line: `main` imports only the asked-for command's module, and the whole
app still lists and runs every command."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

from procs import ROOT

from switchyard import cli

PROBE = """
import sys
sys.argv = ["switchyard", *{argv!r}]
from switchyard import cli
try:
    cli.main()
except SystemExit as e:
    assert not e.code, e.code
print(sorted(m for m in sys.modules if m.startswith("switchyard.")))
"""


def loaded(*argv: str) -> set[str]:
    """The switchyard modules a `switchyard ARGV` process imported (run in a fresh interpreter)."""
    r = subprocess.run([sys.executable, "-c", PROBE.format(argv=list(argv))], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(ast.literal_eval(r.stdout.strip().splitlines()[-1]))


def test_serve_imports_only_its_own_module() -> None:
    mods = loaded("serve", "--help")
    assert "switchyard.api.cli" in mods
    for other in ("switchyard.replay.cli", "switchyard.cluster.cli", "switchyard.classify.cli",
                  "switchyard.engine.serving.cli", "switchyard.gateway.cli"):
        assert other not in mods, other


def test_engine_serve_skips_the_gateway_and_replay() -> None:
    mods = loaded("engine", "serve", "--help")
    assert "switchyard.engine.serving.cli" in mods
    assert "switchyard.replay.cli" not in mods and "switchyard.api.cli" not in mods


def test_no_command_lists_every_command_and_a_typo_is_an_error() -> None:
    r = subprocess.run([sys.executable, "-m", "switchyard.cli", "--help"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    for name in cli.COMMANDS:
        assert name in r.stdout, name
    bad = subprocess.run([sys.executable, "-m", "switchyard.cli", "serv"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "No such command" in bad.stderr


def test_the_whole_app_has_every_command_as_main_registers_it() -> None:
    names = {c.name for c in cli.app.registered_commands} | {g.name for g in cli.app.registered_groups}
    assert names == set(cli.COMMANDS)
    for name in cli.COMMANDS:
        one = cli.build(name)
        assert {c.name for c in one.registered_commands} | {g.name for g in one.registered_groups} == {name}
