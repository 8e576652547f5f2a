"""The GPU engine's peer for issue #32: a plain Llama decoder as gpt-fast writes one (our own
code), compiled by torch.compile, the whole decode step replayed as one CUDA graph, one host
sync a step. bench/engine_cuda.py --peer times it beside our engine in the same run.

    python bench/peer_compiled.py --shape smollm2-135m --batches 1,16 --tokens 64        # alone
    python bench/peer_compiled.py --shape tiny --batches 1,2 --tokens 4 --device cpu      # smoke

What makes it fair: the same shapes (model/random_weights.SHAPES), bf16 weights and KV cache,
random values, the same prompt length before the timed steps, greedy argmax on the device and
the tokens read back each step (the one host sync a serving loop needs). What makes it the peer
the issue names: a static KV cache [layers, batch, kv_heads, max_len, head_dim] written with
index_copy_, attention by SDPA over the whole cache with a causal mask, one decoder layer compiled
by inductor (the same compiled code runs every layer: it takes the layer's weights as inputs, so
compile time does not grow with depth) and the step captured as one CUDA graph, which is what
`mode="reduce-overhead"` does, without its graph-tree bookkeeping. The LM head is bf16 (gpt-fast's
choice; ours recomputes the best 32 logits of a row in float32, which costs it a little).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from switchyard.engine.model.config import ModelConfig  # noqa: E402
from switchyard.engine.model.random_weights import SHAPES  # noqa: E402

PROMPT = 128  # as bench/engine_cuda.py


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    xf = x.float()
    rot = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rot * sin).to(x.dtype)


def layer(x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          n1: torch.Tensor, wqkv: torch.Tensor, wo: torch.Tensor, n2: torch.Tensor, w13: torch.Tensor,
          w2: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, heads: int, kv_heads: int, eps: float) -> torch.Tensor:
    """One decoder layer over x [B, T, D] at positions pos [T], its cache kc/vc [B, Hkv, max_len, hd]."""
    B, T, _ = x.shape
    hd = kc.shape[-1]
    qkv = F.linear(_rms(x, n1, eps), wqkv)
    q, k, v = qkv.split((heads * hd, kv_heads * hd, kv_heads * hd), dim=-1)
    q = _rope(q.view(B, T, heads, hd), cos, sin).transpose(1, 2)
    k = _rope(k.view(B, T, kv_heads, hd), cos, sin).transpose(1, 2)
    kc.index_copy_(2, pos, k)
    vc.index_copy_(2, pos, v.view(B, T, kv_heads, hd).transpose(1, 2))
    o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
    x = x + F.linear(o.transpose(1, 2).reshape(B, T, heads * hd), wo)
    g, u = F.linear(_rms(x, n2, eps), w13).chunk(2, dim=-1)
    return x + F.linear(F.silu(g) * u, w2)


class PeerLlama:
    """Random bf16 weights of shape c, a static cache for `batch` rows of max_len positions."""

    def __init__(self, c: ModelConfig, dev: torch.device, batch: int, max_len: int,
                 dtype: torch.dtype = torch.bfloat16, compile: bool = True) -> None:
        g = torch.Generator(device=dev).manual_seed(0)

        def rand(*shape: int) -> torch.Tensor:
            return (torch.randn(shape, generator=g, device=dev, dtype=torch.float32) * 0.02).to(dtype)

        D, H, Hkv, hd, inter = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
        self.c, self.dev, self.batch, self.max_len = c, dev, batch, max_len
        self.embed = rand(c.vocab_size, D)
        self.lm_head = self.embed if c.tie_embeddings else rand(c.vocab_size, D)
        self.norm = torch.ones(D, device=dev)
        self.layers = [(torch.ones(D, device=dev), rand((H + 2 * Hkv) * hd, D), rand(D, H * hd),
                        torch.ones(D, device=dev), rand(2 * inter, D), rand(D, inter)) for _ in range(c.num_layers)]
        self.k = torch.zeros(c.num_layers, batch, Hkv, max_len, hd, dtype=dtype, device=dev)
        self.v = torch.zeros_like(self.k)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().float().to(dev), emb.sin().float().to(dev)
        self.causal = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool, device=dev))
        self.layer = torch.compile(layer, fullgraph=True, dynamic=False) if compile else layer
        # The decode step's static inputs and output, for the graph.
        self.ids = torch.zeros(batch, 1, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(1, dtype=torch.int64, device=dev)
        self.out = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        c = self.c
        x = F.embedding(ids, self.embed)
        mask = self.causal[pos].view(1, 1, pos.shape[0], self.max_len)
        cos, sin = self.cos[pos].view(1, -1, 1, c.head_dim), self.sin[pos].view(1, -1, 1, c.head_dim)
        for li, w in enumerate(self.layers):
            x = self.layer(x, pos, mask, cos, sin, *w, self.k[li], self.v[li], c.num_heads, c.num_kv_heads, c.rms_eps)
        return F.linear(_rms(x[:, -1], self.norm, c.rms_eps), self.lm_head)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Prompts [batch, T] from position 0, eager attention kernels (prefill is not timed)."""
        pos = torch.arange(ids.shape[1], device=self.dev)
        logits = _eager_forward(self, ids.to(self.dev), pos)
        return logits.argmax(-1)

    @torch.inference_mode()
    def decode(self, nxt: torch.Tensor, pos: int) -> list[int]:
        """One greedy step: the tokens back on the host (the step's one sync)."""
        self.ids.copy_(nxt.view(-1, 1), non_blocking=True)
        self.pos.fill_(pos)
        if self.graph is None:
            self.out.copy_(self._forward(self.ids, self.pos).argmax(-1))
            if self.dev.type == "cuda":  # captured after a warm run, as reduce-overhead does
                torch.cuda.synchronize(self.dev)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.out.copy_(self._forward(self.ids, self.pos).argmax(-1))
        else:
            self.graph.replay()
        return self.out.tolist()


def _eager_forward(m: PeerLlama, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    c = m.c
    x = F.embedding(ids, m.embed)
    T = pos.shape[0]
    mask = m.causal[pos].view(1, 1, T, m.max_len)
    cos, sin = m.cos[pos].view(1, T, 1, c.head_dim), m.sin[pos].view(1, T, 1, c.head_dim)
    for li, w in enumerate(m.layers):
        x = layer(x, pos, mask, cos, sin, *w, m.k[li], m.v[li], c.num_heads, c.num_kv_heads, c.rms_eps)
    return F.linear(_rms(x[:, -1], m.norm, c.rms_eps), m.lm_head)


def peer_decode_rate(c: ModelConfig, dev: torch.device, batch: int, tokens: int, compile: bool = True) -> dict[str, Any]:
    """Prefill `batch` prompts of PROMPT tokens, then time `tokens` greedy decode steps."""
    t0 = time.perf_counter()
    m = PeerLlama(c, dev, batch, PROMPT + tokens + 8, compile=compile)
    nxt = m.prefill(torch.randint(0, c.vocab_size, (batch, PROMPT)))
    pos = PROMPT
    for _ in range(3):  # compile, warm, capture
        nxt = torch.tensor(m.decode(nxt, pos), device=dev)
        pos += 1
    ready = time.perf_counter() - t0
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t = time.perf_counter()
    for _ in range(tokens - 3):
        nxt = torch.tensor(m.decode(nxt, pos), device=dev)
        pos += 1
    dt = time.perf_counter() - t
    steps = tokens - 3
    del m
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"tok_s": batch * steps / dt, "step_ms": dt / steps * 1000, "setup_s": ready}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    for b in (int(x) for x in a.batches.split(",")):
        r = peer_decode_rate(SHAPES[a.shape], dev, b, a.tokens, compile=not a.no_compile)
        print(json.dumps({"shape": a.shape, "batch": b, **{k: round(v, 3) for k, v in r.items()}}), flush=True)


if __name__ == "__main__":
    main()
