"""One request inside the engine: its prompt, sampling parameters, output so far, KV blocks
and where its events go (the HTTP handler's sink)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from switchyard.engine.chat.grammar import GrammarState
from switchyard.engine.chat.tokenizer import Detokenizer
from switchyard.engine.core.kv_blocks import SeqBlocks
from switchyard.engine.core.sampling import SamplingParams

Event = dict[str, Any]
_ids = itertools.count(1)


@dataclass
class Sequence:
    prompt: list[int]
    params: SamplingParams
    sink: Callable[[Event], None]
    id: int = field(default_factory=lambda: next(_ids))
    slot: int = -1  # decode row while admitted (the GPU model's decode steps run in slot space)
    computed: int = 0  # tokens whose keys and values are in the cache: prompt, then output
    out: list[int] = field(default_factory=list)
    detok: Detokenizer | None = None
    generator: torch.Generator | None = None
    emitted: int = 0  # characters of detok.text already sent
    pending_logprobs: list[dict[str, Any]] = field(default_factory=list)
    arrived: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    grammar: GrammarState | None = None  # constrained decoding: the tokens it allows, each step
    kv: SeqBlocks = field(default_factory=SeqBlocks)
    cached_tokens: int = 0  # prompt tokens the prefix cache served at admission
    admitted: int = 0  # admission order, kept through preemptions: the latest is preempted first
    preemptions: int = 0
    inflight: int = 0  # tokens sampled on the device and not yet read (async decode: 0 or 1)
    finished: bool = False  # finished or aborted: a token still in flight for it is dropped

    @property
    def ctx_len(self) -> int:
        return len(self.prompt) + len(self.out)

    def tokens(self, a: int, b: int) -> list[int]:
        """(prompt + out)[a:b] without building the whole list."""
        n = len(self.prompt)
        if b <= n:
            return self.prompt[a:b]
        if a >= n:
            return self.out[a - n:b - n]
        return self.prompt[a:] + self.out[:b - n]
