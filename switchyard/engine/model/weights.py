"""Read one rank's shard of a model's weights from GGUF (dequantized) or safetensors.

Names are canonical (HF-style, without the `model.` prefix). A rank reads only the rows or
columns it owns; for GGUF, row shards are sliced before dequantization, so a rank never
dequantizes another rank's rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from switchyard.engine.model.config import ConfigError, ModelConfig, from_gguf, from_hf
from switchyard.engine.model.gguf_file import GGUFFile

_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GGUF_TOP = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight", "rope_freqs": "rope_freqs.weight"}


class WeightSource(Protocol):
    config: ModelConfig

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None,
             permute_heads: int | None = None) -> torch.Tensor: ...


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> HF's half-split layout)."""
    dim = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


class GGUFSource:
    def __init__(self, path: Path) -> None:
        import gguf

        self._gguf = gguf
        self.path = Path(path)
        self.reader = GGUFFile(path)
        self.config = from_gguf(self.reader)
        self._tensors = {t.name: t for t in self.reader.tensors}

    def _name(self, name: str) -> str:
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            return f"blk.{i}.{_GGUF_LAYER[rest]}"
        return _GGUF_TOP[name]

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None,
             permute_heads: int | None = None) -> torch.Tensor:
        t = self._tensors[self._name(name)]
        data = t.data
        if rows is not None:
            data = data[rows]
        qtype = t.tensor_type
        if qtype in (self._gguf.GGMLQuantizationType.F32, self._gguf.GGMLQuantizationType.F16,
                     self._gguf.GGMLQuantizationType.BF16):
            arr = np.asarray(self._gguf.quants.dequantize(np.ascontiguousarray(data), qtype), dtype=np.float32)
        else:
            arr = self._gguf.quants.dequantize(np.ascontiguousarray(data), qtype).astype(np.float32)
        if permute_heads is not None and self.config.arch == "llama":
            arr = _unpermute(arr, permute_heads)
        if cols is not None:
            arr = arr[:, cols]
        if not arr.flags.writeable or not arr.flags.c_contiguous:
            arr = np.array(arr, dtype=np.float32, order="C")
        return torch.from_numpy(arr)


class SafetensorsSource:
    def __init__(self, directory: Path) -> None:
        from safetensors import safe_open

        self.dir = Path(directory)
        self.config = from_hf(self.dir / "config.json")
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            mapping: dict[str, str] = json.loads(index.read_text())["weight_map"]
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise ConfigError(f"no .safetensors files in {self.dir}")
            mapping = {}
            for f in files:
                with safe_open(str(f), framework="pt") as h:
                    mapping.update({k: f.name for k in h.keys()})  # noqa: SIM118
        self._map = mapping
        self._open = safe_open
        self._handles: dict[str, Any] = {}

    def _key(self, name: str) -> str:
        return name if name == "lm_head.weight" else f"model.{name}"

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None,
             permute_heads: int | None = None) -> torch.Tensor:
        key = self._key(name)
        fname = self._map[key]
        if fname not in self._handles:
            self._handles[fname] = self._open(str(self.dir / fname), framework="pt")
        sl = self._handles[fname].get_slice(key)
        if rows is not None and cols is not None:
            t = sl[rows, cols]
        elif rows is not None:
            t = sl[rows]
        elif cols is not None:
            t = sl[:, cols]
        else:
            t = sl[:]
        return t.to(torch.float32).contiguous()


def open_source(path: Path) -> GGUFSource | SafetensorsSource:
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return GGUFSource(path)
    if path.is_dir() and (path / "config.json").exists():
        return SafetensorsSource(path)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if ggufs:
            return GGUFSource(ggufs[0])
    raise ConfigError(f"{path}: not a .gguf file nor a directory with config.json + safetensors")


@dataclass(frozen=True)
class Shard:
    """Which slice of each parallel dimension one rank owns."""

    rank: int
    tp: int
    config: ModelConfig

    @property
    def heads(self) -> int:
        return self.config.num_heads // self.tp

    @property
    def kv_heads(self) -> int:
        return max(1, self.config.num_kv_heads // self.tp)

    @property
    def padded_vocab(self) -> int:
        return -(-self.config.vocab_size // self.tp) * self.tp

    @property
    def vocab_rows(self) -> tuple[int, int]:
        per = self.padded_vocab // self.tp
        return self.rank * per, (self.rank + 1) * per

    def q_rows(self) -> slice:
        d = self.config.head_dim
        return slice(self.rank * self.heads * d, (self.rank + 1) * self.heads * d)

    def kv_rows(self) -> slice:
        c = self.config
        if c.num_kv_heads % self.tp == 0:
            first = self.rank * self.kv_heads
        else:
            first = self.rank // (self.tp // c.num_kv_heads)  # replicated KV head
        return slice(first * c.head_dim, (first + self.kv_heads) * c.head_dim)

    def ffn_rows(self) -> slice:
        per = self.config.intermediate_size // self.tp
        return slice(self.rank * per, (self.rank + 1) * per)


def _heads_slice(src: WeightSource, name: str, rows: slice, n_heads: int, head_dim: int) -> torch.Tensor:
    """Rows of whole heads; GGUF's Q/K permutation is within a head, so undo it on the slice."""
    return src.read(name, rows=rows, permute_heads=(rows.stop - rows.start) // head_dim)


def load_shard(src: GGUFSource | SafetensorsSource, rank: int, tp: int) -> dict[str, torch.Tensor]:
    """This rank's tensors, float32, keyed by canonical name."""
    c = src.config
    c.check_tp(tp)
    if c.intermediate_size % tp:
        raise ConfigError(f"TP={tp} does not divide the FFN width {c.intermediate_size}")
    sh = Shard(rank, tp, c)
    out: dict[str, torch.Tensor] = {}
    lo, hi = sh.vocab_rows
    emb = torch.zeros(hi - lo, c.hidden_size)
    real_hi = min(hi, c.vocab_size)
    if real_hi > lo:
        emb[: real_hi - lo] = src.read("embed_tokens.weight", rows=slice(lo, real_hi))
    out["embed_tokens.weight"] = emb
    if not c.tie_embeddings:
        head = torch.zeros(hi - lo, c.hidden_size)
        if real_hi > lo:
            head[: real_hi - lo] = src.read("lm_head.weight", rows=slice(lo, real_hi))
        out["lm_head.weight"] = head
    out["norm.weight"] = src.read("norm.weight")
    if c.rope_scaling.get("from_gguf_rope_freqs"):
        out["rope_freqs"] = src.read("rope_freqs")
    d = c.head_dim
    for i in range(c.num_layers):
        p = f"layers.{i}."
        out[p + "input_layernorm.weight"] = src.read(p + "input_layernorm.weight")
        out[p + "post_attention_layernorm.weight"] = src.read(p + "post_attention_layernorm.weight")
        out[p + "self_attn.q_proj.weight"] = _heads_slice(src, p + "self_attn.q_proj.weight", sh.q_rows(), sh.heads, d)
        out[p + "self_attn.k_proj.weight"] = _heads_slice(src, p + "self_attn.k_proj.weight", sh.kv_rows(),
                                                          sh.kv_heads, d)
        out[p + "self_attn.v_proj.weight"] = src.read(p + "self_attn.v_proj.weight", rows=sh.kv_rows())
        if c.qkv_bias:
            for n, rows in (("q", sh.q_rows()), ("k", sh.kv_rows()), ("v", sh.kv_rows())):
                out[p + f"self_attn.{n}_proj.bias"] = src.read(p + f"self_attn.{n}_proj.bias")[rows]
        if c.qk_norm:
            out[p + "self_attn.q_norm.weight"] = src.read(p + "self_attn.q_norm.weight")
            out[p + "self_attn.k_norm.weight"] = src.read(p + "self_attn.k_norm.weight")
        out[p + "self_attn.o_proj.weight"] = src.read(p + "self_attn.o_proj.weight", cols=sh.q_rows())
        out[p + "mlp.gate_proj.weight"] = src.read(p + "mlp.gate_proj.weight", rows=sh.ffn_rows())
        out[p + "mlp.up_proj.weight"] = src.read(p + "mlp.up_proj.weight", rows=sh.ffn_rows())
        out[p + "mlp.down_proj.weight"] = src.read(p + "mlp.down_proj.weight", cols=sh.ffn_rows())
    return out
