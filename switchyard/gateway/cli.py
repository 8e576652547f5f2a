"""`switchyard policy check|explain|schema` and `switchyard keys ...`."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

policy_app = typer.Typer(no_args_is_help=True)
keys_app = typer.Typer(no_args_is_help=True)

@policy_app.command("check")
def policy_check(files: Annotated[list[Path], typer.Argument(help="Policy files or folders")]) -> None:
    """Validate policy files: exit 1 with file:line: reason for every problem found."""
    from switchyard.errors import PolicyError
    from switchyard.gateway.gateway import offline_gateway
    from switchyard.policy.loader import load_policy, policy_files

    bad = 0
    for f in policy_files(list(files)):
        try:
            spec = load_policy(f)
            if spec.classifier.kind == "onnx":  # a model file that will not load: the gateway would refuse it
                offline_gateway().build_classifier(spec, f)
            typer.echo(f"{f}: ok ({len(spec.pools)} pools, {len(spec.routes)} routes)")
        except PolicyError as e:
            bad += 1
            for issue in e.issues:
                typer.echo(str(issue), err=True)
    raise typer.Exit(1 if bad else 0)


@policy_app.command("explain")
def policy_explain(
    file: Annotated[Path, typer.Argument(help="Policy file")],
    request: Annotated[list[Path], typer.Option(
        "--request", "-r", help="Request body JSON file ('-' for stdin); repeat it for the turns of one "
                                "session, routed in order with the session state a gateway keeps")],
    header: Annotated[list[str], typer.Option("--header", "-H", help="NAME: VALUE (repeatable)")] = [],  # noqa: B006
    as_json: Annotated[bool, typer.Option("--json", help="One JSON trace per request, as /v1/route gives it")] = False,
) -> None:
    """Why a request goes where it goes: features, label, each rule checked in order, the decision."""
    from switchyard.classify.features import extract
    from switchyard.errors import PolicyError
    from switchyard.gateway.gateway import offline_gateway
    from switchyard.gateway.routing import session_id_of

    bodies = []
    for r in request:
        raw = sys.stdin.read() if str(r) == "-" else r.read_text()
        try:
            bodies.append(json.loads(raw))
        except json.JSONDecodeError as e:
            typer.echo(f"{r}: not JSON: {e}", err=True)
            raise typer.Exit(1) from None
    headers = {}
    for h in header:
        k, _, v = h.partition(":")
        headers[k.strip().lower()] = v.strip()

    async def explain() -> None:
        gw = offline_gateway([file])
        try:
            lp = gw.policies()[0]
            if not as_json:
                typer.echo(f"policy: {lp.name} ({file})")
            for body in bodies:
                body = {"model": lp.name, **body} if isinstance(body, dict) else body
                target = gw.resolve(body.get("model", lp.name)) if isinstance(body, dict) else None
                if target is None or target.policy is not lp:
                    target = gw.resolve(lp.name)
                assert target is not None
                f = extract(body, headers)
                routed = await gw.route(target, f, body, session_id_of(body, headers))
                trace = routed.trace()
                if as_json:
                    trace["features"] = f.summary()
                    typer.echo(json.dumps(trace))
                    continue
                lab = routed.decision.label
                typer.echo(f"features: tools={f.tools} turns={f.turns} messages={f.messages} "
                           f"tool_result={f.tool_result} prompt_tokens~{f.prompt_tokens} model={f.model!r}")
                typer.echo(f"text: {f.text[:120]!r}")
                typer.echo(f"label: {lab.name or '-'} confidence={lab.confidence:.3f} ({lab.kind})"
                           + (f": {routed.classifier_error}" if routed.classifier_error else ""))
                for c in routed.checks:
                    typer.echo(f"  {'MATCH' if c.matched else 'no   '}  {c.rule}: {c.when}")
                typer.echo(json.dumps(routed.decision.to_dict(), indent=2))
        finally:
            await gw.aclose()

    try:
        asyncio.run(explain())
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None


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
    from switchyard.gateway.keys import make_key, open_keystore

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
    from switchyard.gateway.keys import open_keystore

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

    from switchyard.gateway.keys import hash_key

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
        from switchyard.gateway.keys import open_keystore

        st = open_keystore(keys_file, redis)
        try:
            await st.put(rec)
        finally:
            await st.aclose()

    asyncio.run(put())
    typer.echo(f"revoked key {rec.id} ({rec.name})")
