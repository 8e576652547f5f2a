"""Old path of model/config.py, kept for cluster/model_check.py."""

from switchyard.engine.model.config import ConfigError, ModelConfig, from_gguf, from_hf

__all__ = ["ConfigError", "ModelConfig", "from_gguf", "from_hf"]
