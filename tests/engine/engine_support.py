"""Shared helpers for the engine tests: the real model, a real server process, HTTP."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from procs import Proc, free_port

# Small KV cache: several servers may run at once on a CI machine.
SERVER_ARGS = ["--max-model-len", "1024", "--max-num-seqs", "8", "--collective", "ring", "--dtype", "float32"]


def get(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def post(url: str, body: Any, timeout: float = 120.0) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def stream(url: str, body: dict[str, Any], timeout: float = 120.0) -> list[dict[str, Any]]:
    """POST with stream=true; the parsed SSE data objects, up to [DONE]."""
    return list(stream_iter(url, body, timeout))


def stream_iter(url: str, body: dict[str, Any], timeout: float = 120.0) -> Iterator[dict[str, Any]]:
    """The same, each object as soon as its line arrives."""
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                break
            yield json.loads(line[6:])


class EngineServer:
    """`switchyard engine serve` as a child process; stopped (and its ranks with it) on close."""

    def __init__(self, model: Path, log: Path, tp: int = 1, extra: list[str] | None = None,
                 env: dict[str, str] | None = None, timeout: float = 150.0, standalone: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        # standalone: the engine's own entry point, which imports nothing of the gateway (a GPU
        # machine carrying only the engine's dependencies runs it).
        entry = ["-m", "switchyard.engine.serving.cli"] if standalone else ["-m", "switchyard.cli", "engine", "serve"]
        cmd = [sys.executable, *entry, "--model", str(model), "--tp", str(tp),
               "--port", str(self.port), *(extra or [])]
        # Ready means /health answers 200: it answers 503 while the model loads.
        self._proc = Proc(cmd, self.url + "/health", log, env, timeout, ready=lambda status: status == 200)
        self.proc = self._proc.p

    def output(self) -> str:
        return self._proc.output()

    def rank_pids(self) -> list[int]:
        """The rank processes a TP>1 supervisor started (its children)."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(x) for x in path.read_text().split()] if path.exists() else []

    def close(self) -> None:
        self._proc.stop(group=False, wait=30)  # the supervisor stops its ranks itself


def smollm2_path() -> Path:
    from switchyard.engine.serving import registry

    return registry.pull("smollm2-135m")


def hf_reference(path: Path) -> tuple[Any, Any]:
    """transformers' own reading of the same GGUF file: (LlamaForCausalLM, tokenizer).

    `from_pretrained(gguf_file=)` needs `accelerate`, which this environment lacks, so we do what
    it does underneath: the config and tokenizer from the GGUF, and transformers' GGUF
    dequantizer (load_gguf_checkpoint) for the weights.
    """
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    with torch.device("meta"):  # no random init: every weight comes from the file
        model = LlamaForCausalLM(cfg).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)  # its buffers are not in the file
    model.to(torch.float32)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tok
