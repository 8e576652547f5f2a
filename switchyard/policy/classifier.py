"""The classifier factory: a policy's `classifier:` block -> a live Classifier.

The one place that turns the policy schema into classify/'s objects (classify/ knows nothing
of policies)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from switchyard.classify.base import Classifier, NoClassifier
from switchyard.classify.llm import CallPool, LLMClassifier
from switchyard.classify.model_file import resolve_model_path
from switchyard.errors import ClassifierLoadError
from switchyard.policy.schema import ClassifierSpec

__all__ = ["CallPool", "build_classifier"]

def build_classifier(spec: ClassifierSpec, base_dir: Path, call_pool: CallPool | None,
                     model_dirs: Sequence[Path] = ()) -> Classifier:
    """Raises ClassifierLoadError (message for the policy author) when the classifier cannot work.
    An ONNX model loads from the policy's folder, the shipped classifiers/ or `model_dirs`."""
    if spec.kind == "none":
        return NoClassifier()
    if spec.kind == "onnx":
        from switchyard.classify.onnx_classifier import OnnxClassifier

        assert spec.path is not None  # the schema requires it for onnx
        return OnnxClassifier.load(resolve_model_path(spec.path, base_dir, model_dirs), expect_labels=list(spec.labels))
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
