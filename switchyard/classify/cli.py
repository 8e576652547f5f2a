"""`switchyard classifier ...` (owned by the classifier work; lazy imports keep start-up fast)."""

import typer

classifier_app = typer.Typer(no_args_is_help=True)
