"""Model sizes and per-node memory: weights are split evenly over a replica's nodes."""

from __future__ import annotations

from pathlib import Path

from switchyard.policy.schema import PoolSpec

GB = 1e9
_WEIGHTS = {".safetensors", ".gguf", ".bin", ".pt"}


def model_size_gb(pool: PoolSpec, base: Path | None) -> tuple[float | None, str]:
    """Weight size of the whole model in GB and where it came from ('' when unknown)."""
    if pool.model_size_gb is not None:
        return pool.model_size_gb, "model_size_gb"
    candidates = [pool.model_file] if pool.model_file else []
    if pool.engine is not None:
        candidates.append(pool.engine.model)
    for raw in candidates:
        p = Path(raw).expanduser()
        for q in ([base / p] if base is not None and not p.is_absolute() else []) + [p]:
            if q.is_file():
                return q.stat().st_size / GB, str(raw)
            weights = [f for f in q.glob("*") if f.suffix in _WEIGHTS] if q.is_dir() else []
            if weights:  # a Hugging Face folder, as vLLM and SGLang load it
                return sum(f.stat().st_size for f in weights) / GB, str(raw)
    return None, ""


def per_node_gb(size_gb: float, nodes_per_replica: int, kv_cache_gb: float) -> float:
    return size_gb / nodes_per_replica + kv_cache_gb
