"""What rank 0's start-up learns and /health reports, shared by the HTTP handlers and the
engine thread (which fills it in as loading proceeds)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from switchyard.engine.chat.grammar import Grammars
from switchyard.engine.chat.tokenizer import ChatTokenizer
from switchyard.engine.core.scheduler import Scheduler


@dataclass
class EngineState:
    """What /health reports; filled in by the engine thread as start-up proceeds."""

    model_name: str
    tp: int
    phase: str = "loading"  # loading | ready | failed | stopping
    reason: str = ""
    collective: dict[str, Any] = field(default_factory=dict)
    scheduler: Scheduler | None = None
    tokenizer: ChatTokenizer | None = None
    max_model_len: int = 0
    started: float = field(default_factory=time.time)
    load_seconds: float = 0.0
    dtype: str = ""
    device: dict[str, Any] = field(default_factory=dict)  # GPU: dtype, CUDA graphs, fused ops
    grammars: Grammars | None = None  # structured output; None while loading or if unavailable
    grammars_reason: str = ""  # why structured output is unavailable

    def structured_output(self) -> dict[str, Any]:
        """What /health and /v1/models say about constrained decoding."""
        if self.grammars is None:
            return {"supported": False, "reason": self.grammars_reason or self.phase}
        fill = {"fill": self.scheduler.output.fill} if self.scheduler is not None else {}
        return {"supported": True, **self.grammars.info(), **fill,
                "tool_choice": ["none", "auto", "required", "function"],
                "response_format": ["text", "json_object", "json_schema"], "parallel_tool_calls": True}

    @property
    def ready(self) -> bool:
        return self.phase == "ready" and self.scheduler is not None and self.scheduler.failed is None
