"""Our engine against transformers reading the same GGUF file: tokenizer, chat template,
logits (float32, max |diff| < 1e-3 on logits of magnitude ~30) and 32 greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_support import EngineServer, hf_reference, post

from switchyard.engine.model.step import Step

TEXTS = ["The capital of France is", "Hello world 12345 it's  \n\n  don't", "héllo 😀 ñ 3.14159",
         "def f(x):\n    return x**2  # comment", "<|im_start|>user\nhi<|im_end|>"]
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."},
          {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one?"}]]
LOGIT_ATOL = 1e-3
pytestmark = pytest.mark.usefixtures("one_thread")  # both models run in this process (conftest.one_thread)


@pytest.fixture(scope="module")
def reference(gguf_path: Path) -> tuple[Any, Any]:
    return hf_reference(gguf_path)


@pytest.fixture(scope="module")
def ours(smollm2: tuple[Any, ...]) -> tuple[Any, Any]:
    from switchyard.engine.model.decoder import Decoder
    from switchyard.engine.model.weights import Shard
    from switchyard.engine.runner.comm import SingleRank

    config, weights, tok, _ = smollm2
    return Decoder(config, Shard(0, 1, config), weights, SingleRank(), max_slots=2, max_len=256), tok


def _ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    out = out["input_ids"] if not isinstance(out, list) else out
    return list(out)


def test_tokenizer_and_chat_template_match(reference: tuple[Any, Any], ours: tuple[Any, Any]) -> None:
    _, ref_tok = reference
    _, tok = ours
    for text in TEXTS:
        assert tok.encode(text) == ref_tok.encode(text, add_special_tokens=False), text
        assert tok.decode(tok.encode(text)) == ref_tok.decode(ref_tok.encode(text, add_special_tokens=False),
                                                              skip_special_tokens=True)
    for chat in CHATS:
        assert tok.render(chat) == ref_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert tok.encode(tok.render(chat)) == _ids(ref_tok, chat)


def test_logits_match_transformers(reference: tuple[Any, Any], ours: tuple[Any, Any]) -> None:
    ref, ref_tok = reference
    model, _ = ours
    prompt = _ids(ref_tok, CHATS[0])
    T = len(prompt)
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        logits = model.forward(Step(ids, torch.arange(T).unsqueeze(0), torch.tensor([0]), torch.tensor([T]),
                               torch.tensor([T]), 1))
        steps = [logits[0]]
        seq = list(prompt)
        for _ in range(8):  # teacher-forced decode through our KV cache
            seq.append(int(steps[-1].argmax()))
            n = len(seq)
            steps.append(model.forward(Step(torch.tensor([[seq[-1]]]), torch.tensor([[n - 1]]), torch.tensor([0]),
                                       torch.tensor([1]), torch.tensor([n]), 1))[0])
        expect = ref(torch.tensor([seq])).logits[0, T - 1:]
    got = torch.stack(steps)
    assert got.shape == expect.shape
    diff = (got - expect).abs().max().item()
    assert diff < LOGIT_ATOL, f"max |logit diff| {diff}"
    assert torch.equal(got.argmax(-1), expect.argmax(-1))


def test_greedy_32_tokens_match_transformers(reference: tuple[Any, Any], server_tp1: EngineServer) -> None:
    ref, ref_tok = reference
    for chat in CHATS:
        prompt = _ids(ref_tok, chat)
        with torch.inference_mode():
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                               attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        expect = ref_tok.decode(out[0, len(prompt):], skip_special_tokens=True)
        status, body = post(server_tp1.url + "/v1/completions",
                            {"prompt": prompt, "max_tokens": 32, "temperature": 0})
        assert status == 200, body
        assert body["choices"][0]["text"] == expect
        assert body["usage"]["completion_tokens"] == len([t for t in out[0, len(prompt):].tolist()
                                                          if t not in (0, 2)])
