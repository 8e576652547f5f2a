"""Old path of serving/cli.py: switchyard/cli.py imports the typer apps from here, and
`python -m switchyard.engine.cli` runs the engine alone."""

from switchyard.engine.serving.cli import engine_app, models_app

__all__ = ["engine_app", "models_app"]

if __name__ == "__main__":
    engine_app()
