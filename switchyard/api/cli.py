"""`switchyard serve`: the gateway on uvicorn (uvloop, httptools), with SIGTERM draining."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from switchyard.api.workers import WorkerInfo

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
    max_body_containers: Annotated[int, typer.Option(
        help="JSON arrays and objects one request body may hold (counted before parsing; 400 beyond)")] = 100_000,
    max_body_items: Annotated[int, typer.Option(
        help="JSON values (array elements, object members) one request body may hold")] = 500_000,
    max_messages: Annotated[int, typer.Option(help="Messages one request may carry")] = 10_000,
    max_content_parts: Annotated[int, typer.Option(help="Content parts one request may carry, all messages")] = 50_000,
    max_tools: Annotated[int, typer.Option(help="Tools one request may declare")] = 1_000,
    max_event_mb: Annotated[float, typer.Option(
        help="Largest SSE event taken from an upstream stream, MB (beyond it the stream ends with an error)")] = 1.0,
    log_level: Annotated[str, typer.Option(help="debug | info | warning | error")] = "info",
    access_log: Annotated[bool, typer.Option(help="Log every request line (query strings left out)")] = False,
    auth: Annotated[bool, typer.Option(help="Require 'Authorization: Bearer KEY' (keys: switchyard keys)")] = False,
    keys_file: Annotated[Path | None, typer.Option(
        help="API keys file (default: Redis with --redis, else ~/.config/switchyard/keys.json)")] = None,
    admin_key: Annotated[str | None, typer.Option(
        envvar="SWITCHYARD_ADMIN_KEY", show_envvar=True,
        help="Key of the admin API (/admin/...); prefer the variable or --admin-key-file (a command "
             "line shows in ps); without a key there is no admin API")] = None,
    admin_key_file: Annotated[Path | None, typer.Option(help="Read the admin key from this file")] = None,
    drain_grace: Annotated[float, typer.Option(
        help="SIGTERM: seconds at most to keep serving with readiness 503 before closing the listener")] = 5.0,
    lease_ttl: Annotated[float, typer.Option(
        help="--redis: seconds a dead gateway's in-flight counts linger before they expire")] = 3.0,
    max_sessions: Annotated[int, typer.Option(
        help="Sessions kept in memory (with --redis: this gateway's local copies); beyond it, the oldest "
             "of the caller holding the most go")] = 200_000,
    max_sessions_per_caller: Annotated[int | None, typer.Option(
        help="Sessions one caller (API key) may hold; beyond it, its own oldest go. Default: --max-sessions")] = None,
    ui: Annotated[bool, typer.Option(help="Serve the dashboard and policy editor at /ui")] = True,
    reports: Annotated[Path | None, typer.Option(
        help="Folder of replay reports (`switchyard replay --out`) the UI lists")] = None,
    allowed_host: Annotated[list[str] | None, typer.Option(
        help="Without --auth: a Host name to answer besides loopback ones (repeatable)")] = None,
    insecure_open: Annotated[bool, typer.Option(
        help="Serve a non-loopback address without API keys (anyone who reaches it may use it)")] = False,
    client_timeout: Annotated[float, typer.Option(
        help="Seconds a response write may make no progress before the request ends")] = 30.0,
    header_timeout: Annotated[float, typer.Option(help="Seconds a client has to send a request's headers")] = 10.0,
    body_timeout: Annotated[float, typer.Option(help="Seconds to wait for the next piece of a request body")] = 30.0,
    max_connections: Annotated[int, typer.Option(help="Open connections and requests; beyond them, 503")] = 1024,
    ui_session_ttl: Annotated[float, typer.Option(
        help="Seconds a UI login lasts before the page must log in again")] = 8 * 3600.0,
    ssl_certfile: Annotated[Path | None, typer.Option(
        help="Serve HTTPS with this PEM certificate (chain); needs --ssl-keyfile")] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="The PEM private key of --ssl-certfile")] = None,
    classifier_dir: Annotated[list[Path] | None, typer.Option(
        help="A folder ONNX classifiers may load from, besides the policy's and the shipped one (repeatable)")] = None,
    otel: Annotated[bool | None, typer.Option(
        "--otel/--no-otel",
        help="OpenTelemetry traces of every request, exported as the OTEL_* variables say (OTLP over "
             "http/protobuf to OTEL_EXPORTER_OTLP_ENDPOINT by default). Default: on when "
             "OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_TRACES_EXPORTER is set; "
             "OTEL_SDK_DISABLED=true turns it off. Needs the otel extra")] = None,
    max_upstream_body: Annotated[str, typer.Option(
        help="Largest non-stream answer taken from an upstream (bytes, or 512K / 32M / 1G); beyond it the "
             "client gets a 502 in its API's shape")] = "32M",
    allow_env: Annotated[list[str] | None, typer.Option(
        help="Environment variables a policy's ${NAME} may expand besides SWITCHYARD_* (a name or a "
             "pattern such as OPENAI_*; repeatable, or comma-separated)")] = None,
    record_max_bytes: Annotated[str, typer.Option(
        help="--record: rotate the trace when it reaches this size (bytes, or 64M / 1G)")] = "256M",
    record_keep: Annotated[int, typer.Option(help="--record: rotated traces kept (FILE.1 .. FILE.N)")] = 3,
    trusted_proxy: Annotated[list[str] | None, typer.Option(
        help="Address or network (10.0.0.0/8) of a reverse proxy whose X-Forwarded-For / -Proto the gateway "
             "believes (repeatable); default none: the client is the socket's peer")] = None,
    config: Annotated[Path | None, typer.Option(
        help="Gateway config YAML: any of these options by name (redis: URL, port: 8000, policy: [...]); "
             "options on the command line win")] = None,
    workers: Annotated[int, typer.Option(
        help="Gateway processes on the one port (SO_REUSEPORT), sharing state through --redis, else a local "
             "redis-server child when installed, else each its own (said in the log and /health)")] = 1,
    worker_restarts: Annotated[int, typer.Option(
        help="--workers: times in all the parent restarts a worker that died (default: none)")] = 0,
    local_redis: Annotated[bool, typer.Option(
        help="--workers without --redis: start a private redis-server (unix socket, no persistence) "
             "for the workers' shared state")] = True,
) -> None:
    o = {k: v for k, v in locals().items() if k not in ("ctx", "config")}
    if config is not None:
        o = _config_file(ctx, config, o)
    logging.basicConfig(level=o["log_level"].upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if o["workers"] < 1 or o["worker_restarts"] < 0:
        typer.echo("--workers must be 1 or more and --worker-restarts 0 or more", err=True)
        raise typer.Exit(2)
    if o["workers"] > 1:
        from switchyard.api.workers import supervise

        raise typer.Exit(supervise(o, o["local_redis"]))
    serve_one(o)


def serve_one(o: dict, worker: WorkerInfo | None = None, sockets: list[socket.socket] | None = None) -> None:
    """One gateway process: `serve`'s options checked, the app built, served until SIGTERM drains it.
    `worker`/`sockets`: one of `serve --workers N` (api/workers.py), on its SO_REUSEPORT socket."""
    from switchyard.api.app import GatewayConfig, create_app
    from switchyard.api.guard import host_name, is_loopback
    from switchyard.api.server import (
        DrainingServer,
        GatewayServerConfig,
        ServerLimits,
        strip_query_strings_from_access_log,
    )
    from switchyard.errors import PolicyError

    key = o["admin_key"]
    if o["admin_key_file"] is not None:
        try:
            key = Path(o["admin_key_file"]).read_text().strip()
        except OSError as e:
            typer.echo(f"--admin-key-file: cannot read {o['admin_key_file']}: {e.strerror or e}", err=True)
            raise typer.Exit(2) from None
    if (o["ssl_certfile"] is None) != (o["ssl_keyfile"] is None):
        typer.echo("--ssl-certfile and --ssl-keyfile go together", err=True)
        raise typer.Exit(2)
    if o["ui_session_ttl"] <= 0:
        typer.echo("--ui-session-ttl must be more than 0 seconds", err=True)
        raise typer.Exit(2)
    try:
        max_upstream_body = parse_size(o["max_upstream_body"])
        record_max_bytes = parse_size(o["record_max_bytes"])
    except ValueError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    if o["record_keep"] < 0:
        typer.echo("--record-keep must be 0 or more", err=True)
        raise typer.Exit(2)
    allow_env = tuple(v.strip() for item in o["allow_env"] or () for v in str(item).split(",") if v.strip())
    trusted = [v.strip() for item in o["trusted_proxy"] or () for v in str(item).split(",") if v.strip()]
    loopback = is_loopback(host_name(o["host"]))
    if not o["auth"] and not loopback and not o["insecure_open"]:
        typer.echo(f"refusing to serve {o['host']} without API keys: anyone who reaches it could use every pool "
                   "and, without an admin key, rewrite the policy. Serve with --auth (and --admin-key-file), "
                   "or pass --insecure-open if that is really what you want.", err=True)
        raise typer.Exit(2)
    gw_config = GatewayConfig(
        policies=list(o["policy"]), max_body_bytes=int(o["max_body_mb"] * 1024 * 1024), watch=o["watch"],
        health_checks=o["health_checks"], record=str(o["record"]) if o["record"] else None,
        admin_key=key or None, ui=o["ui"], reports_dir=str(o["reports"]) if o["reports"] else None,
        body_timeout=o["body_timeout"], allowed_hosts=tuple(o["allowed_host"] or ()),
        check_host=not o["insecure_open"], classifier_dirs=tuple(str(d) for d in o["classifier_dir"] or ()),
        ui_session_ttl=o["ui_session_ttl"], max_upstream_body=max_upstream_body, allow_env=allow_env,
        record_max_bytes=record_max_bytes, record_keep=o["record_keep"],
    )
    if o["auth"]:
        from switchyard.gateway.keys import open_keystore

        gw_config.keystore = open_keystore(o["keys_file"], o["redis"])
    from switchyard.api.body import BodyLimits

    gw_config.body_limits = BodyLimits(
        max_containers=o["max_body_containers"], max_items=o["max_body_items"], max_messages=o["max_messages"],
        max_parts=o["max_content_parts"], max_tools=o["max_tools"])
    gw_config.max_event_bytes = max(1, int(o["max_event_mb"] * 1024 * 1024))
    tracing = None
    if tracing_wanted(o["otel"], os.environ):
        try:
            from switchyard.gateway.tracing import Tracing
        except ImportError as e:
            typer.echo(f"tracing needs OpenTelemetry's SDK ({e.name} is missing): pip install 'switchyard[otel]'",
                       err=True)
            raise typer.Exit(2) from None
        try:
            tracing = Tracing()
        except ValueError as e:
            typer.echo(f"tracing: {e}", err=True)
            raise typer.Exit(2) from None
    if o["max_sessions"] < 1 or (o["max_sessions_per_caller"] or 1) < 1:
        typer.echo("--max-sessions and --max-sessions-per-caller must be 1 or more", err=True)
        raise typer.Exit(2)
    from switchyard.state.memory import MemoryStore

    state = MemoryStore(o["max_sessions"], o["max_sessions_per_caller"])
    # The workers' local redis-server holds their state only: keys stay where --keys-file / --redis say.
    state_url = o["redis"] or (worker.state_url if worker is not None else None)
    if state_url:
        from switchyard.state.redis import RedisStore

        state = RedisStore(state_url, lease_ttl=o["lease_ttl"], local=state)
    try:
        app = create_app(gw_config, state, tracing)
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    names = [lp.name for lp in app.state.gateway.policies()]
    tls = o["ssl_certfile"] is not None
    where = f"{'https' if tls else 'http'}://{o['host']}:{o['port']}"
    rt = app.state.runtime
    if worker is not None:
        rt.worker_info = lambda: worker.describe(rt.admitted)
    if worker is None or worker.index == 0:  # the first worker speaks for all
        typer.echo(f"switchyard: serving policies {', '.join(names)} on {where}/v1 (model 'auto' = {names[0]})"
                   + (f", {worker.count} workers, state {worker.state}" if worker is not None else ""))
    if o["ui"] and (worker is None or worker.index == 0):
        typer.echo(f"switchyard: dashboard and policy editor on {where}/ui")
    if tracing is not None:
        d = tracing.describe()
        typer.echo(f"switchyard: tracing on: service {d['service']}, exporter {d['exporter']}"
                   + (f" to {d['endpoint']}" if "endpoint" in d else ""))
    if o["access_log"]:
        strip_query_strings_from_access_log()
    limits = ServerLimits(header_timeout=o["header_timeout"], body_timeout=o["body_timeout"],
                          client_timeout=o["client_timeout"], max_connections=o["max_connections"])
    uv = GatewayServerConfig(
        app, limits, rt.metrics.client_stalls.inc, host=o["host"], port=o["port"], loop="uvloop",
        log_level=o["log_level"].lower(), access_log=o["access_log"], timeout_graceful_shutdown=30, lifespan="on",
        ssl_certfile=str(o["ssl_certfile"]) if tls else None, ssl_keyfile=str(o["ssl_keyfile"]) if tls else None,
        # X-Forwarded-For / -Proto only from the proxies named: uvicorn's default believes loopback,
        # which lets any local process pick the client address the UI's login throttle keys on.
        proxy_headers=bool(trusted), forwarded_allow_ips=trusted or None,
    )
    DrainingServer(uv, rt, o["drain_grace"]).run(sockets=sockets)


def worker_main() -> None:
    """A process of `serve --workers N`: options from the parent on stdin (api/workers.py), then one
    gateway on its SO_REUSEPORT socket."""
    import pickle
    import sys

    from switchyard.api.workers import reuse_port_socket

    o, info = pickle.loads(sys.stdin.buffer.read())
    logging.basicConfig(level=o["log_level"].upper(),
                        format=f"%(asctime)s %(levelname)s %(name)s [w{info.index}]: %(message)s")
    sock = reuse_port_socket(o["host"], o["port"])
    try:
        serve_one(o, info, [sock])
    except typer.Exit as e:
        sys.exit(e.exit_code)


_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


def parse_size(text: str | int) -> int:
    """'32M', '512kb', '1G', '4096' -> bytes (binary units); ValueError naming what was wrong."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if m is None or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with K, M or G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def tracing_wanted(flag: bool | None, env: Mapping[str, str]) -> bool:
    """--otel/--no-otel, else whether the OTEL_* variables name an exporter or an endpoint;
    OTEL_SDK_DISABLED=true (the standard switch) turns tracing off whatever else says."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if flag is not None:
        return flag
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


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
        elif key in ("record", "keys_file", "reports", "ssl_certfile", "ssl_keyfile") and value is not None:
            value = Path(path.parent / value)
        out[key] = value
    return out
