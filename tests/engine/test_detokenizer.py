"""The scheduler's streaming detokenizer on the real SmolLM2 tokenizer."""

from __future__ import annotations

from pathlib import Path


def test_incremental_detokenizer_equals_full_decode(gguf_path: Path) -> None:
    """Streaming text, token by token through a short window, adds up to decoding the whole
    output at once: spaces, newlines, multi-byte characters split over tokens, emoji."""
    from switchyard.engine.chat.tokenizer import Detokenizer, from_gguf
    from switchyard.engine.model.weights import open_source

    tok = from_gguf(open_source(gguf_path).reader)
    text = ("Paris is the capital of France.\n\n  Indented line; naïve café, 東京は日本の首都です。 "
            "Emoji: 🚀🎉👩‍👩‍👧 and math: ∑ x² ≥ 0. ") * 30
    ids = tok.encode(text)
    d = Detokenizer(tok)
    pieces = [d.push(i) for i in ids]
    assert "".join(pieces) == d.text == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
