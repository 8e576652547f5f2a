"""The `switchyard` command line: one typer app, each area's commands in its own module.

`main` (the console script, `python -m switchyard.cli`) imports only the module of the command it
is asked for: `serve` and `engine serve` start without importing replay, the cluster planner or
the classifier trainer (about 0.25 s of imports a process, paid by every gateway, every engine
rank and every test that starts one). `app` is the whole app, for the help listing and for code
that drives the CLI in process (tests, typer's CliRunner).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

import typer


@dataclass(frozen=True)
class Entry:
    module: str
    attr: str
    help: str
    group: bool = False  # a typer app of subcommands (else one command function)


COMMANDS: dict[str, Entry] = {
    "serve": Entry("switchyard.api.cli", "serve", "Run the gateway in front of the pools a policy names."),
    "up": Entry("switchyard.cluster.up", "up", "Start the embedded default: engine replicas + gateway, on this machine."),
    "plan": Entry("switchyard.cluster.cli", "plan",
                  "Plan a cluster: placement, checks, projected throughput, launch files."),
    "replay": Entry("switchyard.replay.cli", "replay", "Replay tool-use traces through policies and score them."),
    "reference-pool": Entry("switchyard.replay.cli", "reference_pool",
                            "Serve replay cases' reference answers as an OpenAI upstream: an upper-bound large "
                            "pool where no stronger model exists."),
    "policy": Entry("switchyard.gateway.cli", "policy_app", "Check, explain and describe policy files.", True),
    "engine": Entry("switchyard.engine.serving.cli", "engine_app", "The tensor-parallel inference server.", True),
    "models": Entry("switchyard.engine.serving.cli", "models_app", "Fetch and list model files.", True),
    "classifier": Entry("switchyard.classify.cli", "classifier_app",
                        "Train, calibrate and evaluate classifiers.", True),
    "keys": Entry("switchyard.gateway.cli", "keys_app", "API keys for the gateway (stored hashed).", True),
}


def build(only: str | None = None) -> typer.Typer:
    """The app with every command, or with `only` that one (the others' modules never imported)."""
    app = typer.Typer(
        name="switchyard",
        help="A multi-model routing gateway for LLM agents, with its own tensor-parallel engine.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    # A group even with one command: typer runs a lone command without its name otherwise.
    app.callback()(_group)
    for name, e in COMMANDS.items():
        if only is not None and name != only:
            continue
        target = getattr(importlib.import_module(e.module), e.attr)
        if e.group:
            app.add_typer(target, name=name, help=e.help)
        else:
            app.command(name, help=e.help)(target)
    return app


def _group() -> None:
    pass  # no options of its own: it only makes the app a group (its help is the Typer's)


def main() -> None:
    """The console script: the asked-for command's module alone; anything else (no command, a
    typo, --help) gets the whole app, so its listing and its errors are typer's own."""
    cmd = sys.argv[1] if len(sys.argv) > 1 else None
    build(cmd if cmd in COMMANDS else None)()


def __getattr__(name: str) -> typer.Typer:
    # `from switchyard.cli import app`: built on first use, so that `main` never pays for it.
    if name == "app":
        globals()["app"] = built = build()
        return built
    raise AttributeError(name)


if __name__ == "__main__":
    main()
