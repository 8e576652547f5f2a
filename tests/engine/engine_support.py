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

# Small KV cache: several servers may run at once on a CI machine. One thread a rank: a test
# machine's two cores are shared (with the test process, other servers, other users), and two
# OpenMP threads a layer then wait on each other's time slices at every op: a float32 server
# answered 24 tokens in 6.3-18.2 s on two threads, 2.2-4.7 s on one (the loaded 2-core AMD EPYC).
ONE_THREAD = ["--threads", "1"]
SERVER_ARGS = ["--max-model-len", "1024", "--max-num-seqs", "8", "--collective", "ring", "--dtype", "float32",
               *ONE_THREAD]
# The shipped dtype (int4 weights, float16 cache where the native kernels run), 12 sequences.
INT4_SERVER_ARGS = ["--max-model-len", "1024", "--max-num-seqs", "12", "--collective", "ring", *ONE_THREAD]
# Two int4 replicas side by side for the balancing tests.
PAIR_ARGS = ["--max-model-len", "1024", "--max-num-seqs", "8", "--collective", "ring", *ONE_THREAD]


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
    dequantizer (load_gguf_checkpoint) for the weights. That reading parses the file three times
    in Python (~35 s on a loaded 2-core machine), so what it gave is kept, as transformers saves
    a model, under the cache (hf-reference/), keyed by the file and transformers' version: a
    new file or a new transformers reads the GGUF again.
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from switchyard.datasets import cache_dir

    st = path.stat()
    saved = cache_dir("hf-reference") / f"{path.stem}-{st.st_size}-{st.st_mtime_ns}-{transformers.__version__}"
    if not (saved / "done").exists():
        _save_hf_reading(path, saved)
    cfg = AutoConfig.from_pretrained(saved)
    with torch.device("meta"):  # no random init: every weight comes from the saved reading
        model = LlamaForCausalLM(cfg).eval()
    from safetensors.torch import load_file

    missing, unexpected = model.load_state_dict(load_file(str(saved / "weights.safetensors")), strict=False,
                                                assign=True)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)  # its buffers are not in the file
    model.to(torch.float32)
    return model, AutoTokenizer.from_pretrained(saved)


def _save_hf_reading(path: Path, saved: Path) -> None:
    """transformers' reading of the GGUF (config, dequantized weights, tokenizer) into `saved`."""
    import shutil
    import tempfile

    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    cfg = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    # A folder of its own, renamed into place whole: test workers reading at once never meet half of one.
    saved.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=saved.name + ".", suffix=".tmp", dir=saved.parent))
    try:
        cfg.save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "weights.safetensors"))
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(tmp)
        (tmp / "done").write_text("")
        if not (saved / "done").exists():
            shutil.rmtree(saved, ignore_errors=True)  # a reading cut short earlier
            try:
                tmp.rename(saved)
            except OSError:  # another worker's reading got there first: it is the same
                pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# Two tools for the structured-output tests: an object with an enum and a bounded integer, and a
# nested object with an array.
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city", "unit", "days"]}
TRIP = {"type": "object", "properties": {
    "traveler": {"type": "object", "properties": {"name": {"type": "string"},
                                                  "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                 "required": ["name", "age"]},
    "destinations": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    "seat": {"type": "string", "enum": ["economy", "business"]}}, "required": ["traveler", "destinations", "seat"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "book_trip", "description": "Book a trip for a traveler",
                                           "parameters": TRIP}}]
SCHEMAS = {"get_weather": WEATHER, "book_trip": TRIP}


def smollm2_grammars() -> tuple[Any, Any]:
    """SmolLM2's tokenizer and its Grammars: from the GGUF, or on a device run the carried copy
    (SWITCHYARD_TEST_TOKENIZER_DIR, as test_cuda_serve reads it; the GGUF is 98 MB)."""
    import os

    from switchyard.engine.chat import tokenizer
    from switchyard.engine.chat.grammar import Grammars

    carried = os.environ.get("SWITCHYARD_TEST_TOKENIZER_DIR")
    if carried:
        tok = tokenizer.from_hf_dir(Path(carried), set())
    else:
        from switchyard.engine.model.gguf_file import GGUFFile

        tok = tokenizer.from_gguf(GGUFFile(smollm2_path()))
    return tok, Grammars(tok.tok.to_str(), tok.vocab_size, sorted(tok.eos_ids))
