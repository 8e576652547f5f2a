"""Model configuration for Llama-family decoders, read from GGUF metadata or an HF config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard.engine.errors import ConfigError
from switchyard.engine.model.gguf_file import GGUFFile

# What --kv-cache-dtype takes (CPU engine); here, free of torch, so the CLI checks it before
# torch loads.
KV_CACHE_DTYPES = ("auto", "float32", "float16")


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # llama | qwen2 | qwen3
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    max_position: int
    tie_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def check_tp(self, tp: int) -> None:
        """Refuse a TP width that cannot split this model's heads evenly."""
        if tp < 1:
            raise ConfigError(f"--tp must be >= 1, got {tp}")
        fits = [n for n in range(1, self.num_heads + 1) if self._fits(n)]
        if not self._fits(tp):
            raise ConfigError(
                f"TP={tp} does not fit this model: {self.num_heads} attention heads and "
                f"{self.num_kv_heads} KV heads (and the FFN width {self.intermediate_size}) must split evenly "
                f"over the ranks "
                f"(KV heads may be replicated). Supported TP widths: {', '.join(map(str, fits))}."
            )

    def _fits(self, tp: int) -> bool:
        if self.num_heads % tp or self.intermediate_size % tp:
            return False
        if self.num_kv_heads % tp == 0:
            return True
        # Replicated KV heads: every rank's query heads must share one KV head.
        return tp % self.num_kv_heads == 0 and (self.num_heads // tp) <= self.num_heads // self.num_kv_heads


def from_gguf(reader: GGUFFile) -> ModelConfig:
    get = reader.fields.get
    arch = str(get("general.architecture"))
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ConfigError(f"unsupported GGUF architecture {arch!r} (llama, qwen2, qwen3 are)")
    p = arch + "."
    names = {t.name for t in reader.tensors}
    heads = int(get(p + "attention.head_count"))
    hidden = int(get(p + "embedding_length"))
    head_dim = int(get(p + "attention.key_length", hidden // heads))
    vocab = get(p + "vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"])
    scaling: dict[str, Any] = {}
    if get(p + "rope.scaling.type") == "llama3" or "rope_freqs.weight" in names:
        scaling = {"rope_type": "llama3", "from_gguf_rope_freqs": "rope_freqs.weight" in names}
    eos = get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get(p + "feed_forward_length")),
        num_layers=int(get(p + "block_count")),
        num_heads=heads,
        num_kv_heads=int(get(p + "attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_eps=float(get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get(p + "rope.freq_base", 10000.0)),
        max_position=int(get(p + "context_length", 2048)),
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        rope_scaling=scaling,
        bos_token_id=get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
    )


def from_hf(path: Path) -> ModelConfig:
    raw = json.loads(Path(path).read_text())
    mt = raw.get("model_type", "llama")
    if mt not in ("llama", "qwen2", "qwen3", "mistral"):
        raise ConfigError(f"unsupported model_type {mt!r} in {path}")
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((int(eos),) if eos is not None else ())
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else {})
    theta = raw.get("rope_theta")
    if theta is None:
        theta = params.get("rope_theta", 10000.0)
    return ModelConfig(
        arch="llama" if mt == "mistral" else mt,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        max_position=int(raw.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=bool(raw.get("attention_bias", mt == "qwen2")),
        qk_norm=mt == "qwen3",
        rope_scaling=dict(scaling),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )
