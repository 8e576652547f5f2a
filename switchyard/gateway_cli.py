"""`switchyard serve`, `switchyard policy ...`, `switchyard keys ...`."""

from __future__ import annotations

import typer

policy_app = typer.Typer(no_args_is_help=True)
keys_app = typer.Typer(no_args_is_help=True)


def serve() -> None:
    """Not built yet."""
    raise SystemExit("not built yet")
