"""The classifier file pair: NAME.onnx (the estimator) + NAME.json (what it means).

The sidecar makes a model file self-describing: its labels, the feature spec that produced its
input rows, the ONNX input/output names, the .onnx file's sha256 (a model swapped without its
sidecar is refused), and how it was trained and how it scored.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard.classify.vectorize import FeatureSpec
from switchyard.errors import ClassifierLoadError

# The repository (or source tree) root: where the shipped `classifiers/` folder lives.
_ROOT = Path(__file__).resolve().parents[2]


SHIPPED_DIR = _ROOT / "classifiers"


def resolve_model_path(path: str, base_dir: Path, extra_dirs: Sequence[Path] | None = ()) -> Path:
    """A policy's `classifier.path`: relative to the policy's folder, else to the switchyard tree
    (so `classifiers/tool-complexity.onnx` finds the shipped model from any policy folder).

    The file must lie in the policy's folder, the shipped classifiers/ or one of `extra_dirs`
    (`serve --classifier-dir`); `extra_dirs=None` lifts that (a path typed on the command line).
    A missing, unreadable and out-of-bounds file all get the same error, so a policy cannot be
    used to learn which files exist elsewhere."""
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [base_dir / p, _ROOT / p]
    roots = None if extra_dirs is None else [base_dir, SHIPPED_DIR, *extra_dirs]
    for c in candidates:
        try:
            real = c.resolve()
        except (OSError, RuntimeError):
            continue
        if roots is not None and not any(real.is_relative_to(r.resolve()) for r in roots):
            continue
        if real.is_file() and os.access(real, os.R_OK):
            return real
    where = "the policy's folder, the shipped classifiers/ or a --classifier-dir" if roots is not None else \
        ", ".join(str(c) for c in candidates)
    raise ClassifierLoadError(f"classifier model {path!r}: not found or not readable in {where}")


FORMAT = "switchyard-classifier"
FORMAT_VERSION = 1


def sidecar_path(model: Path) -> Path:
    return model.with_suffix(".json")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ModelMeta:
    labels: list[str]
    features: FeatureSpec
    input_name: str
    output_name: str
    sha256: str
    trained: dict[str, Any]

    def to_json(self, model_file: str) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "model_file": model_file,
            "sha256": self.sha256,
            "labels": self.labels,
            "input": self.input_name,
            "output": self.output_name,
            "features": self.features.to_json(),
            "trained": self.trained,
        }


def read_meta(model: Path) -> ModelMeta:
    """The sidecar of `model`, validated; ClassifierLoadError with the file name otherwise."""
    side = sidecar_path(model)
    if not side.is_file():
        raise ClassifierLoadError(
            f"{model}: its sidecar {side.name} is missing (a classifier model is NAME.onnx + NAME.json, "
            "both written by `switchyard classifier train`)"
        )
    try:
        d = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ClassifierLoadError(f"{side}: not valid JSON ({e})") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ClassifierLoadError(f"{side}: not a switchyard classifier sidecar (format is not {FORMAT!r})")
    if d.get("format_version") != FORMAT_VERSION:
        raise ClassifierLoadError(
            f"{side}: format_version {d.get('format_version')!r}, this switchyard reads {FORMAT_VERSION}; "
            "retrain with `switchyard classifier train`"
        )
    labels = d.get("labels")
    if not isinstance(labels, list) or len(labels) < 2 or not all(isinstance(x, str) and x for x in labels):
        raise ClassifierLoadError(f"{side}: `labels` must list at least two label names")
    if len(set(labels)) != len(labels):
        raise ClassifierLoadError(f"{side}: `labels` has duplicates: {labels}")
    try:
        spec = FeatureSpec.from_json(d.get("features"))
    except ValueError as e:
        raise ClassifierLoadError(f"{side}: feature spec does not match this switchyard: {e}") from None
    for key in ("input", "output", "sha256"):
        if not isinstance(d.get(key), str) or not d[key]:
            raise ClassifierLoadError(f"{side}: `{key}` is missing")
    trained = d.get("trained") if isinstance(d.get("trained"), dict) else {}
    return ModelMeta(labels, spec, d["input"], d["output"], d["sha256"], trained)


def write_meta(model: Path, meta: ModelMeta) -> Path:
    side = sidecar_path(model)
    tmp = side.with_suffix(".json.part")
    tmp.write_text(json.dumps(meta.to_json(model.name), indent=2) + "\n", encoding="utf-8")
    tmp.replace(side)
    return side
