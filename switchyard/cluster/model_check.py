"""Our engine's TP check at plan time: the model's heads must split over the replica's ranks.

The engine refuses such a TP width when it starts; checking at plan time says so before a
cluster is booked. It needs the model here (a pulled registry name or a path); when it is
not, the plan notes that the check was skipped.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


def _local_path(model: str, base: Path | None) -> Path | None:
    from switchyard.engine.serving import registry

    p = Path(model).expanduser()
    if base is not None and not p.is_absolute() and (base / p).exists():
        return base / p
    try:
        return registry.resolve(model, pull_missing=False)
    except registry.ModelNotFound:
        return None


@functools.lru_cache(maxsize=8)
def _gguf_config(path: str, mtime_ns: int, size: int) -> Any:
    """Once per file version, not once per pool that names the model."""
    from switchyard.engine.model.config import from_gguf  # the engine extra's: gguf, numpy
    from switchyard.engine.model.gguf_file import GGUFFile

    return from_gguf(GGUFFile(path))


def tp_problem(pool: str, model: str, tp: int, base: Path | None) -> tuple[str | None, str | None]:
    """(error, note): the error when TP cannot split this model, a note when it was not checked."""
    from switchyard.engine.model.config import ConfigError, from_hf

    path = _local_path(model, base)
    if path is None:
        return None, f"pool {pool}: model {model} is not on this machine, so TP {tp} is not checked against its heads"
    try:
        if path.is_dir():
            config = from_hf(path / "config.json")
        else:
            st = path.stat()
            config = _gguf_config(str(path), st.st_mtime_ns, st.st_size)
    except ImportError:
        return None, f"pool {pool}: TP {tp} not checked against the model's heads (install the engine extra)"
    except ConfigError as e:
        return f"pool {pool}: {e}", None
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"pool {pool}: could not read {path} to check TP {tp} ({type(e).__name__}: {e})"
    try:
        config.check_tp(tp)
    except ConfigError as e:
        return f"pool {pool}: {model}: {e} Change the replica's shape (nodes_per_replica x ranks_per_node).", None
    return None, None
