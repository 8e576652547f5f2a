"""Offline schema checks of emitted files, as a cluster would check them, without a cluster.

Kubernetes kinds: the Kubernetes JSON schemas (strict: unknown fields refused) that the
kubernetes-validate package ships. LeaderWorkerSet: the CRD's schema, trimmed, in
schemas/leaderworkerset-v1.json, resolved against those same Kubernetes definitions. Compose
files: the compose specification's JSON Schema, as check-jsonschema vendors it.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

import jsonschema
import kubernetes_validate
from referencing import Registry, Resource

KUBERNETES = "1.34"
LWS_SCHEMA = Path(__file__).parent / "schemas" / "leaderworkerset-v1.json"


def _where(e: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in e.absolute_path) or "<top>"


@cache
def _lws_validator() -> jsonschema.Draft202012Validator:
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{KUBERNETES}.0-local-strict"
    definitions = Resource.from_contents(json.loads((folder / "_definitions.json").read_text()))
    schema = json.loads(LWS_SCHEMA.read_text())
    registry = Registry().with_resources([(definitions.id(), definitions), (schema["$id"], Resource.from_contents(schema))])
    return jsonschema.Draft202012Validator(schema, registry=registry)


def k8s_problems(doc: dict) -> list[str]:
    """Why the API server (with the LWS CRD installed) would refuse this document; [] when it would not."""
    name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    if doc.get("kind") == "LeaderWorkerSet":
        return [f"{name}: {_where(e)}: {e.message}" for e in _lws_validator().iter_errors(doc)]
    try:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{name}: {_where(e)}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{name}: {e.message}"]
    return []


@cache
def _compose_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def compose_problems(doc: dict) -> list[str]:
    return [f"{_where(e)}: {e.message}" for e in _compose_validator().iter_errors(doc)]
