"""The `switchyard` command line: one typer app, each area's commands in its own module."""

from __future__ import annotations

import typer

from switchyard.api.cli import serve
from switchyard.classify.cli import classifier_app
from switchyard.cluster.cli import plan
from switchyard.cluster.up import up
from switchyard.engine.serving.cli import engine_app, models_app
from switchyard.gateway.cli import keys_app, policy_app
from switchyard.replay.cli import reference_pool, replay

app = typer.Typer(
    name="switchyard",
    help="A multi-model routing gateway for LLM agents, with its own tensor-parallel engine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(help="Run the gateway in front of the pools a policy names.")(serve)
app.command(help="Start the embedded default: engine replicas + gateway, on this machine.")(up)
app.command(help="Plan a cluster: placement, checks, projected throughput, launch files.")(plan)
app.command(help="Replay tool-use traces through policies and score them.")(replay)
app.command("reference-pool", help="Serve replay cases' reference answers as an OpenAI upstream: an upper-bound "
            "large pool where no stronger model exists.")(reference_pool)
app.add_typer(policy_app, name="policy", help="Check, explain and describe policy files.")
app.add_typer(engine_app, name="engine", help="The tensor-parallel inference server.")
app.add_typer(models_app, name="models", help="Fetch and list model files.")
app.add_typer(classifier_app, name="classifier", help="Train, calibrate and evaluate classifiers.")
app.add_typer(keys_app, name="keys", help="API keys for the gateway (stored hashed).")

if __name__ == "__main__":
    app()
