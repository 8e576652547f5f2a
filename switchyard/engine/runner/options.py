"""A replica's options, typed and checked once, whoever builds them: `engine serve`'s flags,
a JSON/YAML file (EngineOptions.from_mapping), a bench or a test. Nothing downstream checks
them again; what depends on the model (its window, the KV pool's size) is resolved at load
time by resolved_len / auto_kv_blocks below."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard.engine.errors import ConfigError
from switchyard.engine.model.config import KV_CACHE_DTYPES

COLLECTIVES = ("ring", "oneshot", "auto")
DTYPES = ("auto", "float32", "bfloat16", "int4")
DECODE_KERNELS = ("auto", "fused", "torch")
DEVICES = ("cpu", "cuda")
GRAMMAR_FILLS = ("auto", "thread", "process")
PIN_CPUS = ("off", "on")
# GPU replicas fill a step's grammar masks with up to this many threads, each row's grammar compiled
# once per lane (chat/grammar.Grammars' lanes): SmolLM2's shape at batch 16 under the items grammar
# ran 1.80x as fast with 8 as with one (0.89x of free decoding; H100, bench/results/gpu_step_cuts call 2).
AUTO_GRAMMAR_THREADS = 8
# A pool's lanes per fill thread: with twice as many lanes as threads, the rows of a batch of up to that
# many share no lexer (the pool's threads take rows as they come, not a lane each): 8 threads over 16
# lanes ran SmolLM2's batch 16 1.13-1.17x as fast as over 8 (H100s, bench/results/gpu_fill_lanes calls 1-2).
LANES_PER_THREAD = 2
# The auto KV pool: one sequence of the whole window, the others at this many tokens on
# average (an agent turn is rarely near the window, and preemption handles the rare crowd).
AVERAGE_SEQ_TOKENS = 2048


@dataclass(frozen=True)
class EngineOptions:
    model_path: Path
    tp: int = 1
    collective: str = "auto"
    max_num_seqs: int = 16  # sequences decoded together (decode slots)
    max_model_len: int = 0  # 0: the model's own window (GGUF context_length, max_position_embeddings)
    max_waiting: int = 256
    max_num_batched_tokens: int = 512  # prompt tokens a prefill step takes (CPU: chunked prefill)
    dtype: str = "auto"  # auto -> int4 | float32 (CPU), bfloat16 | float32 (GPU)
    kv_cache_dtype: str = "auto"  # CPU: float32 or float16, resolved at load
    block_size: int = 16  # positions per KV block
    num_kv_blocks: int = 0  # blocks per rank; 0: auto_kv_blocks
    prefix_caching: bool = True  # the scheduler's (rank 0) business; every rank holds the same tables
    threads: int = 0  # torch threads per rank; 0: cores / local ranks
    collective_timeout_s: float = 10.0
    device: str = "cpu"
    cuda_graphs: bool = True  # GPU: replay decode steps as CUDA graphs
    decode_kernels: str = "auto"  # GPU, one rank: fused Triton kernels | torch ops | auto
    async_decode: bool = True  # launch decode step n+1 before reading step n's tokens (where it holds)
    prefill_fp8: bool = False  # GPU, cuda backend: long prefills' projections in FP8 (backends/cuda/fp8.py)
    grammar_threads: int = 0  # rank 0's threads filling the grammar masks; 0: auto_grammar_threads(device)
    grammar_fill: str = "auto"  # where they fill: a thread of the engine's | a process of their own | auto
    pin_cpus: str = "off"  # on (a GPU, one rank): the loop thread and the fill process on cores of their own

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_path", Path(self.model_path))
        for name, allowed in (("collective", COLLECTIVES), ("dtype", DTYPES), ("kv_cache_dtype", KV_CACHE_DTYPES),
                              ("decode_kernels", DECODE_KERNELS), ("device", DEVICES), ("grammar_fill", GRAMMAR_FILLS),
                              ("pin_cpus", PIN_CPUS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"--{_flag(name)} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name, lo in (("tp", 1), ("max_num_seqs", 1), ("max_model_len", 0), ("max_waiting", 0),
                         ("max_num_batched_tokens", 1), ("num_kv_blocks", 0), ("threads", 0),
                         ("grammar_threads", 0)):
            if getattr(self, name) < lo:
                raise ConfigError(f"--{_flag(name)} must be at least {lo}, got {getattr(self, name)}")
        if not 1 <= self.block_size <= 256:
            raise ConfigError(f"--block-size must be between 1 and 256, got {self.block_size}")
        if self.collective_timeout_s <= 0:
            raise ConfigError("--collective-timeout must be positive")
        if self.prefill_fp8 and (self.device != "cuda" or self.tp > 1 or self.decode_kernels == "torch"
                                 or self.dtype not in ("auto", "bfloat16")):
            # What the GPU itself must allow (sm89+) is checked at load (model/decoder.py).
            raise ConfigError("--prefill-fp8 runs on the cuda backend only: --device cuda, --tp 1, --decode-kernels "
                              f"auto or fused, bfloat16 weights (got --device {self.device}, --tp {self.tp}, "
                              f"--decode-kernels {self.decode_kernels}, --dtype {self.dtype})")
        if self.pin_cpus == "on" and (self.device != "cuda" or self.tp > 1):
            raise ConfigError(f"--pin-cpus on is for a GPU replica of one rank (got --device {self.device}, --tp {self.tp})")
        if self.max_model_len and 0 < self.num_kv_blocks * self.block_size < self.max_model_len:
            raise ConfigError(f"--num-kv-blocks must be 0 (auto) or hold one sequence of --max-model-len: at least "
                              f"{-(-self.max_model_len // self.block_size)} blocks of {self.block_size}")

    @property
    def fill_threads(self) -> int:
        """The grammar masks' fill threads: --grammar-threads, or auto."""
        return self.grammar_threads or auto_grammar_threads(self.device)

    @property
    def fill_process(self) -> bool:
        """Whether the grammar masks are filled by a process of their own (chat/grammar_process), which
        spares a GPU replica's short steps the fill thread's GIL hand-overs (bench/results/gpu_fill_lanes):
        auto on a GPU. A CPU replica's steps are long enough to hide the thread's; there the process
        would only cost a core's spinning."""
        return self.grammar_fill == "process" or (self.grammar_fill == "auto" and self.device == "cuda")

    @property
    def pins_cpus(self) -> bool:
        """Whether the loop thread and the grammar fill process take cores of their own (engine/affinity.py):
        --pin-cpus on, for a GPU replica of one rank, whose short steps a moved or crowded loop thread misses.
        Off by default: replicas sharing a host would each take the first core of the CPUs they may use, so
        each needs CPUs of its own first (taskset, a container's cpuset)."""
        return self.pin_cpus == "on"

    @property
    def fill_lanes(self) -> int:
        """Each grammar's compilations (chat/grammar.Grammars' lanes): LANES_PER_THREAD a fill thread
        with a pool, one without (one thread shares nothing)."""
        return grammar_lanes(self.fill_threads)

    @property
    def backend(self) -> str:
        """The decoder backend asked for (backends/registry.py): cpu on a CPU; on a GPU cuda
        (--decode-kernels fused), torch, or auto (cuda where it can run, else torch)."""
        if self.device == "cpu":
            return "cpu"
        return {"auto": "auto", "fused": "cuda", "torch": "torch"}[self.decode_kernels]

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> EngineOptions:
        """From a parsed file (keys as the fields are named, `-` or `_`): unknown keys and values
        of the wrong type are refused, as the CLI would refuse them."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {}
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in fields:
                raise ConfigError(f"unknown engine option {key!r}")
            want = {"Path": (str, Path), "int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}
            types = want[str(fields[name].type)]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise ConfigError(f"engine option {key!r} must be {fields[name].type}, got {value!r}")
            kw[name] = value
        if "model_path" not in kw:
            raise ConfigError("engine options need model_path")
        return cls(**kw)

    def replace(self, **changes: Any) -> EngineOptions:
        return dataclasses.replace(self, **changes)


def resolved_len(opts: EngineOptions, window: int) -> int:
    """The context length served: --max-model-len, or the model's window when 0, never past it."""
    return min(opts.max_model_len, window) if opts.max_model_len else window


def auto_kv_blocks(max_num_seqs: int, max_len: int, block_size: int) -> int:
    """KV blocks when --num-kv-blocks is 0: one sequence of the whole window (a lone sequence
    must always fit: preemption relies on it) plus max_num_seqs - 1 of AVERAGE_SEQ_TOKENS.
    SmolLM2 at its 8192 window and 16 sequences: 512 + 15 * 128 = 2432 blocks, 1.8 GB of float32
    cache, where sixteen whole windows would take 6 GB."""
    per_seq = -(-max_len // block_size)
    return per_seq + (max_num_seqs - 1) * -(-min(max_len, AVERAGE_SEQ_TOKENS) // block_size)


def _flag(name: str) -> str:
    return {"collective_timeout_s": "collective-timeout"}.get(name, name.replace("_", "-"))


def grammar_lanes(threads: int) -> int:
    """The lanes for a pool of `threads` fill threads (options.fill_lanes)."""
    return threads * LANES_PER_THREAD if threads > 1 else 1


def auto_grammar_threads(device: str) -> int:
    """A GPU replica's: AUTO_GRAMMAR_THREADS, at most half the host's cores (the engine's thread and
    the GPU's launches keep the rest); a CPU replica's: one (its cores decode)."""
    return max(1, min(AUTO_GRAMMAR_THREADS, (os.cpu_count() or 2) // 2)) if device == "cuda" else 1
