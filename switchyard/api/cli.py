"""`switchyard serve`: the gateway on uvicorn (uvloop, httptools), with SIGTERM draining."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

PolicyOpt = Annotated[
    list[Path],
    typer.Option("--policy", "-p", help="Policy file or folder of them (repeatable); each is a virtual model"),
]


def serve(
    ctx: typer.Context,
    policy: PolicyOpt = [Path("policies/example.yaml")],  # noqa: B006 - typer reads the default
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8000,
    redis: Annotated[str | None, typer.Option(help="Share state through Redis, e.g. redis://127.0.0.1:6379/0")] = None,
    record: Annotated[Path | None, typer.Option(help="Append every request to this JSONL trace")] = None,
    watch: Annotated[bool, typer.Option(help="Reload policy files when they change")] = True,
    health_checks: Annotated[bool, typer.Option(help="Check replicas' /health in the background")] = True,
    max_body_mb: Annotated[float, typer.Option(help="Largest request body accepted, MB")] = 16.0,
    log_level: Annotated[str, typer.Option(help="debug | info | warning | error")] = "info",
    access_log: Annotated[bool, typer.Option(help="Log every request line")] = False,
    auth: Annotated[bool, typer.Option(help="Require 'Authorization: Bearer KEY' (keys: switchyard keys)")] = False,
    keys_file: Annotated[Path | None, typer.Option(
        help="API keys file (default: Redis with --redis, else ~/.config/switchyard/keys.json)")] = None,
    admin_key: Annotated[str | None, typer.Option(
        envvar="SWITCHYARD_ADMIN_KEY", help="Key of the admin API (/admin/...); without it there is none")] = None,
    drain_grace: Annotated[float, typer.Option(
        help="SIGTERM: seconds at most to keep serving with readiness 503 before closing the listener")] = 5.0,
    lease_ttl: Annotated[float, typer.Option(
        help="--redis: seconds a dead gateway's in-flight counts linger before they expire")] = 3.0,
    ui: Annotated[bool, typer.Option(help="Serve the dashboard and policy editor at /ui")] = True,
    reports: Annotated[Path | None, typer.Option(
        help="Folder of replay reports (`switchyard replay --out`) the UI lists")] = None,
    config: Annotated[Path | None, typer.Option(
        help="Gateway config YAML: any of these options by name (redis: URL, port: 8000, policy: [...]); "
             "options on the command line win")] = None,
) -> None:
    import uvicorn

    from switchyard.api.app import GatewayConfig, create_app
    from switchyard.errors import PolicyError

    if config is not None:
        o = _config_file(ctx, config, {k: v for k, v in locals().items() if k not in ("ctx", "config")})
        policy, host, port, redis, record = o["policy"], o["host"], o["port"], o["redis"], o["record"]
        watch, health_checks, max_body_mb, log_level = o["watch"], o["health_checks"], o["max_body_mb"], o["log_level"]
        access_log, auth, keys_file, admin_key = o["access_log"], o["auth"], o["keys_file"], o["admin_key"]
        drain_grace, lease_ttl, ui, reports = o["drain_grace"], o["lease_ttl"], o["ui"], o["reports"]
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = GatewayConfig(
        policies=list(policy), max_body_bytes=int(max_body_mb * 1024 * 1024), watch=watch,
        health_checks=health_checks, record=str(record) if record else None,
        admin_key=admin_key or None, ui=ui, reports_dir=str(reports) if reports else None,
    )
    if auth:
        from switchyard.gateway.keys import open_keystore

        config.keystore = open_keystore(keys_file, redis)
    state = None
    if redis:
        try:
            from switchyard.state.redis import RedisStore
        except ImportError:
            typer.echo("--redis: the Redis state store is not available in this build", err=True)
            raise typer.Exit(2) from None
        state = RedisStore(redis, lease_ttl=lease_ttl)
    try:
        app = create_app(config, state)
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    names = [lp.name for lp in app.state.gateway.policies()]
    typer.echo(f"switchyard: serving policies {', '.join(names)} on http://{host}:{port}/v1 (model 'auto' = {names[0]})")
    if ui:
        typer.echo(f"switchyard: dashboard and policy editor on http://{host}:{port}/ui")
    from switchyard.api.admin import DrainingServer

    uv = uvicorn.Config(
        app, host=host, port=port, loop="uvloop", http="httptools", log_level=log_level.lower(),
        access_log=access_log, timeout_graceful_shutdown=30, lifespan="on",
    )
    DrainingServer(uv, app.state.runtime, drain_grace).run()


def _config_file(ctx: typer.Context, path: Path, opts: dict) -> dict:
    """Options from a YAML file, for those not given on the command line."""
    import yaml
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        typer.echo(f"{path}: cannot read the gateway config: {e}", err=True)
        raise typer.Exit(2) from None
    if not isinstance(data, dict):
        typer.echo(f"{path}: a gateway config is a mapping of option: value", err=True)
        raise typer.Exit(2)
    out = dict(opts)
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key == "policies":
            key = "policy"
        if key not in opts:
            typer.echo(f"{path}: unknown option {raw_key!r}; known: {', '.join(sorted(opts))}", err=True)
            raise typer.Exit(2)
        source = ctx.get_parameter_source(key)  # typer may carry its own click: compare by name
        if source is not None and source.name != "DEFAULT":
            continue
        if key == "policy":
            value = [Path(path.parent / v) for v in ([value] if isinstance(value, str) else value)]
        elif key in ("record", "keys_file", "reports") and value is not None:
            value = Path(path.parent / value)
        out[key] = value
    return out
