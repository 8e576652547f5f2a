"""`switchyard engine ...` and `switchyard models ...` (owned by the engine work).

Keep torch imports inside the commands: every `switchyard` start imports this module.
"""

import typer

engine_app = typer.Typer(no_args_is_help=True)
models_app = typer.Typer(no_args_is_help=True)
