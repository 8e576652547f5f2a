"""Old path of serving/registry.py, kept for cluster/ and replay/ (and their tests)."""

from switchyard.engine.serving.registry import KNOWN, KnownModel, ModelNotFound, models_dir, pull, resolve

__all__ = ["KNOWN", "KnownModel", "ModelNotFound", "models_dir", "pull", "resolve"]
