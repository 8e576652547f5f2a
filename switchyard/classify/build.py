"""Policy `classifier:` block -> a live Classifier. The gateway's one entry point into classify/."""

from __future__ import annotations

from pathlib import Path

from switchyard.classify.base import Classifier, NoClassifier
from switchyard.classify.errors import ClassifierLoadError
from switchyard.classify.llm import CallPool, LLMClassifier
from switchyard.policy.schema import ClassifierSpec

__all__ = ["CallPool", "ClassifierLoadError", "build_classifier", "resolve_model_path"]

# The repository (or source tree) root: where the shipped `classifiers/` folder lives.
_ROOT = Path(__file__).resolve().parents[2]


def resolve_model_path(path: str, base_dir: Path) -> Path:
    """An absolute path as is; else relative to the policy's folder; else to the switchyard tree
    (so `classifiers/tool-complexity.onnx` finds the shipped model from any policy folder)."""
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [base_dir / p, _ROOT / p]
    for c in candidates:
        if c.is_file():
            return c
    tried = ", ".join(str(c) for c in candidates)
    raise ClassifierLoadError(f"classifier model {path!r} not found (looked in: {tried})")


def build_classifier(spec: ClassifierSpec, base_dir: Path, call_pool: CallPool | None) -> Classifier:
    """Raises ClassifierLoadError (message for the policy author) when the classifier cannot work."""
    if spec.kind == "none":
        return NoClassifier()
    if spec.kind == "onnx":
        from switchyard.classify.onnx_classifier import OnnxClassifier

        assert spec.path is not None  # the schema requires it for onnx
        return OnnxClassifier.load(resolve_model_path(spec.path, base_dir), expect_labels=list(spec.labels))
    if spec.kind == "llm":
        if call_pool is None:
            raise ClassifierLoadError("classifier kind llm needs the gateway's pools (no call_pool given)")
        assert spec.pool is not None
        return LLMClassifier(
            pool=spec.pool,
            call_pool=call_pool,
            labels=list(spec.labels),
            failure_label=spec.failure_label,
            timeout=spec.timeout,
            prompt=spec.prompt,
        )
    raise ClassifierLoadError(f"unknown classifier kind {spec.kind!r}")
