"""`switchyard serve`, `switchyard policy check|explain|schema`, `switchyard keys ...`."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

policy_app = typer.Typer(no_args_is_help=True)
keys_app = typer.Typer(no_args_is_help=True)

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
    from switchyard.policy.loader import PolicyError

    if config is not None:
        o = _config_file(ctx, config, {k: v for k, v in locals().items() if k not in ("ctx", "config")})
        policy, host, port, redis, record = o["policy"], o["host"], o["port"], o["redis"], o["record"]
        watch, health_checks, max_body_mb, log_level = o["watch"], o["health_checks"], o["max_body_mb"], o["log_level"]
        access_log, auth, keys_file, admin_key = o["access_log"], o["auth"], o["keys_file"], o["admin_key"]
        drain_grace, lease_ttl, ui, reports = o["drain_grace"], o["lease_ttl"], o["ui"], o["reports"]
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = GatewayConfig(
        policies=list(policy), max_body_bytes=int(max_body_mb * 1024 * 1024), watch=watch,
        health_checks=health_checks, record=str(record) if record else None, redis_url=redis,
        admin_key=admin_key or None, ui=ui, reports_dir=str(reports) if reports else None,
    )
    if auth:
        from switchyard.keys import open_keystore

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
    DrainingServer(uv, app.state.api, drain_grace).run()


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


@policy_app.command("check")
def policy_check(files: Annotated[list[Path], typer.Argument(help="Policy files or folders")]) -> None:
    """Validate policy files: exit 1 with file:line: reason for every problem found."""
    from switchyard.policy.loader import PolicyError, load_policy, policy_files

    bad = 0
    for f in policy_files(list(files)):
        try:
            spec = load_policy(f)
            _check_classifier(spec, f)
            typer.echo(f"{f}: ok ({len(spec.pools)} pools, {len(spec.routes)} routes)")
        except PolicyError as e:
            bad += 1
            for issue in e.issues:
                typer.echo(str(issue), err=True)
    raise typer.Exit(1 if bad else 0)


def _check_classifier(spec, path: Path) -> None:
    """A classifier file that will not load is a policy error too (the gateway would refuse it)."""
    if spec.classifier.kind != "onnx":
        return
    from switchyard.gateway import Gateway
    from switchyard.state.memory import MemoryStore

    Gateway(MemoryStore())._build_classifier(spec, path)


@policy_app.command("explain")
def policy_explain(
    file: Annotated[Path, typer.Argument(help="Policy file")],
    request: Annotated[Path, typer.Option("--request", "-r", help="Request body JSON file ('-' for stdin)")],
    header: Annotated[list[str], typer.Option("--header", "-H", help="NAME: VALUE (repeatable)")] = [],  # noqa: B006
) -> None:
    """Why a request goes where it goes: features, label, each rule checked in order, the decision."""
    from switchyard.classify.base import NO_LABEL
    from switchyard.classify.features import extract
    from switchyard.policy.loader import PolicyError, load_policy
    from switchyard.policy.rules import compile_policy

    try:
        spec = load_policy(file)
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    raw = sys.stdin.read() if str(request) == "-" else request.read_text()
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as e:
        typer.echo(f"{request}: not JSON: {e}", err=True)
        raise typer.Exit(1) from None
    headers = {}
    for h in header:
        k, _, v = h.partition(":")
        headers[k.strip().lower()] = v.strip()
    f = extract(body, headers)
    label = NO_LABEL
    if spec.classifier.kind != "none":
        from switchyard.gateway import Gateway
        from switchyard.state.memory import MemoryStore

        clf = Gateway(MemoryStore())._build_classifier(spec, file)
        label = asyncio.run(clf.classify(f, body))
    compiled = compile_policy(spec)
    typer.echo(f"policy: {compiled.name} ({file})")
    typer.echo(f"features: tools={f.tools} turns={f.turns} messages={f.messages} tool_result={f.tool_result} "
               f"prompt_tokens~{f.prompt_tokens} model={f.model!r}")
    typer.echo(f"text: {f.text[:120]!r}")
    typer.echo(f"label: {label.name or '-'} confidence={label.confidence:.3f} ({label.kind})")
    for rule in compiled.rules:
        hit = rule.matches(f, label)
        typer.echo(f"  {'MATCH' if hit else 'no   '}  {rule.name}: {rule.reason()}")
        if hit:
            break
    d = compiled.evaluate(f, label, None)
    typer.echo(json.dumps(d.to_dict(), indent=2))


@policy_app.command("schema")
def policy_schema() -> None:
    """Print the policy JSON Schema (point your editor's YAML language server at it)."""
    from switchyard.policy.schema import PolicySpec

    schema = PolicySpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Switchyard policy"
    typer.echo(json.dumps(schema, indent=2))


# --- switchyard keys ------------------------------------------------------------------------

KeysFileOpt = Annotated[Path | None, typer.Option(
    help="Keys file (default: Redis with --redis, else ~/.config/switchyard/keys.json or $SWITCHYARD_KEYS_FILE)")]
RedisOpt = Annotated[str | None, typer.Option(help="Keep keys in this Redis (shared by the gateways using it)")]


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="Who the key is for (shown in metrics and listings)")],
    policies: Annotated[list[str] | None, typer.Option(
        help="Policies (or 'auto') the key may use, comma-separated or repeated; default: all")] = None,
    pools: Annotated[list[str] | None, typer.Option(
        help="Pools the key may reach (routed or direct); default: all")] = None,
    rpm: Annotated[int | None, typer.Option(help="Requests per minute (default: no limit)")] = None,
    tpm: Annotated[int | None, typer.Option(help="Tokens per minute, from upstream usage (default: no limit)")] = None,
    keys_file: KeysFileOpt = None,
    redis: RedisOpt = None,
) -> None:
    """Create a key and print it once: only its SHA-256 is stored."""
    from switchyard.keys import make_key, open_keystore

    key, rec = make_key(name, _split(policies), _split(pools), rpm, tpm)
    store = open_keystore(keys_file, redis)

    async def put() -> None:
        try:
            await store.put(rec)
        finally:
            await store.aclose()

    asyncio.run(put())
    typer.echo(key)
    typer.echo(f"key {rec.id} for {name!r} stored in {store.where}; it is shown only now", err=True)


def _load_keys(keys_file: Path | None, redis: str | None):
    from switchyard.keys import open_keystore

    store = open_keystore(keys_file, redis)

    async def load():
        try:
            return await store.load_all()
        finally:
            await store.aclose()

    return store, asyncio.run(load())


@keys_app.command("list")
def keys_list(
    keys_file: KeysFileOpt = None,
    redis: RedisOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines")] = False,
) -> None:
    """List keys (never the keys themselves: id, name, last 4 characters, limits, state)."""
    import time as _time

    _, keys = _load_keys(keys_file, redis)
    for rec in sorted(keys.values(), key=lambda r: r.created):
        if as_json:
            typer.echo(json.dumps(rec.public()))
            continue
        state = "revoked" if rec.revoked else "active"
        created = _time.strftime("%Y-%m-%d %H:%M", _time.localtime(rec.created))
        typer.echo(f"{rec.id}  {rec.name:<16} ...{rec.hint}  {state:<7}  policies={','.join(rec.policies or ['*'])}"
                   f"  pools={','.join(rec.pools or ['*'])}  rpm={rec.rpm or '-'}  tpm={rec.tpm or '-'}  {created}")


@keys_app.command("revoke")
def keys_revoke(
    key: Annotated[str, typer.Argument(help="Key id, name (when only one key has it), or the key itself")],
    keys_file: KeysFileOpt = None,
    redis: RedisOpt = None,
) -> None:
    """Revoke a key: gateways answer 401 for it within about a second."""
    import time as _time

    from switchyard.keys import hash_key

    store, keys = _load_keys(keys_file, redis)
    found = [r for r in keys.values() if key in (r.id, r.name) or r.hash == hash_key(key)]
    if not found:
        typer.echo(f"no key {key!r} in {store.where}", err=True)
        raise typer.Exit(1)
    if len(found) > 1:
        typer.echo(f"{len(found)} keys are named {key!r}: revoke by id ({', '.join(r.id for r in found)})", err=True)
        raise typer.Exit(1)
    rec = found[0]
    rec.revoked = rec.revoked or _time.time()

    async def put() -> None:
        from switchyard.keys import open_keystore

        st = open_keystore(keys_file, redis)
        try:
            await st.put(rec)
        finally:
            await st.aclose()

    asyncio.run(put())
    typer.echo(f"revoked key {rec.id} ({rec.name})")
