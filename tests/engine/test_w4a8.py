"""The avx2-w4a8 build (int8 activations, llama.cpp's q4_1 x q8_1 scheme) against llama.cpp itself:
the same SmolLM2 Q4_1 file, the same prompt ids, greedy. Its numbers are llama.cpp's, not the
float32 engine's: on "What is the capital of France?" both answer "L'Étoile, la Marseillaise, ..."
where the float32-activation builds answer "The capital of France is Paris." (that one is
test_native's SmolLM2 test). Needs llama.cpp built (`make llama-cpp`) and an AVX2 CPU."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from procs import Proc

from switchyard.engine.backends.cpu import native as nat

PROMPTS = ("What is the capital of France?", "Name three fruits.", "Count from one to five.")
NEW = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from switchyard import llamacpp

    reason = llamacpp.missing_reason()
    if reason:
        pytest.skip(reason)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = Proc([str(llamacpp.locate().server), "-m", str(gguf_path), "--port", str(port), "-t", "1",
                 "--ctx-size", "512"], url + "/health", tmp_path_factory.mktemp("w4a8") / "llama-server.log",
                timeout=120, ready=lambda s: s == 200)
    try:
        yield url
    finally:
        proc.stop()


def _llama_cpp_greedy(url: str, ids: list[int]) -> list[int]:
    body = {"prompt": ids, "n_predict": NEW, "temperature": 0, "return_tokens": True, "cache_prompt": False}
    req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["tokens"]


def test_w4a8_build_decodes_as_llama_cpp(llama_server: str, gguf_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         one_thread: None) -> None:
    from test_native import _greedy

    from switchyard.engine.chat.tokenizer import from_gguf
    from switchyard.engine.model.decoder import Decoder
    from switchyard.engine.model.weights import Shard, load_shard, open_source
    from switchyard.engine.runner.comm import SingleRank

    monkeypatch.setenv("SWITCHYARD_NATIVE", "avx2-w4a8")
    nat.load.cache_clear()
    try:
        lib, why = nat.load()
        if lib is None:
            pytest.skip(f"avx2-w4a8 kernels unavailable: {why}")
        src = open_source(gguf_path)
        tok = from_gguf(src.reader)
        prompts = [tok.encode(tok.render([{"role": "user", "content": p}])) for p in PROMPTS]
        model = Decoder(src.config, Shard(0, 1, src.config), load_shard(src, 0, 1), SingleRank(), max_slots=3,
                        max_len=128, dtype="int4")
        with torch.inference_mode():
            ours = _greedy(model, prompts, NEW)
    finally:
        nat.load.cache_clear()
    theirs = [_llama_cpp_greedy(llama_server, p) for p in prompts]
    assert ours == theirs
    assert "Paris" not in tok.decode(ours[0])  # llama.cpp's answer, not the float32 engine's
