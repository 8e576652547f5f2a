"""What the docs name, checked against the code in one process (tests/test_docs.py runs it).

Reads {"commands": [[word, ...], ...], "modules": [dotted, ...]} on stdin: each command is the
words that followed `switchyard` in a doc. Prints JSON: per command the subcommand path it
resolves to, what did not resolve, the options it names that the command lacks, and the exit
status of `switchyard PATH --help`; per module what could not be imported or looked up. One
process, because `switchyard --help` alone costs about a second of start-up on 2 cores.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from typing import Any

import typer
from typer.testing import CliRunner

OPTION = re.compile(r"^--?[A-Za-z][\w-]*")


def resolve(root: Any, words: list[str]) -> dict[str, Any]:
    """Walk the subcommands the words name; the words after the last one are its arguments."""
    cmd, path, i = root, [], 0
    # Typer vendors its own click: a group is whatever has subcommands, not a click.Group.
    while isinstance(getattr(cmd, "commands", None), dict) and i < len(words):
        name = words[i]
        sub = cmd.commands.get(name)
        if sub is None:
            if OPTION.match(name) or not re.match(r"^[a-z][\w-]*$", name):
                break  # an option or a placeholder (`...`, FILE) after a group: nothing more to resolve
            return {"path": path, "error": f"no command {name!r} under `{' '.join(['switchyard', *path])}`"}
        cmd, path, i = sub, [*path, name], i + 1
    known = {"--help"}
    for p in cmd.params:
        known.update(getattr(p, "opts", ()))
        known.update(getattr(p, "secondary_opts", ()))
    missing = [w for w in words[i:] if OPTION.match(w) and w.split("=", 1)[0] not in known]
    defaults = {p.opts[0]: p.default for p in cmd.params if p.param_type_name == "option"}
    return {"path": path, "error": None, "unknown_options": missing, "defaults": defaults}


def module(name: str) -> str | None:
    """None when `name` is a module, or an attribute reached from the longest importable prefix."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for attr in parts[n:]:
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:n])} has no {'.'.join(parts[n:])!r}"
            obj = getattr(obj, attr)
        return None
    return f"no module {name}"


def main() -> None:
    req = json.load(sys.stdin)
    from switchyard.cli import app

    root = typer.main.get_command(app)
    runner = CliRunner()
    helped: dict[tuple[str, ...], int] = {}
    commands = []
    for words in req["commands"]:
        r = resolve(root, words)
        if r["error"] is None:
            path = tuple(r["path"])
            if path not in helped:
                res = runner.invoke(app, [*path, "--help"])
                helped[path] = res.exit_code
            r["help_exit"] = helped[path]
        commands.append(r)
    json.dump({"commands": commands, "modules": {m: module(m) for m in req["modules"]}}, sys.stdout, default=str)


if __name__ == "__main__":
    main()
