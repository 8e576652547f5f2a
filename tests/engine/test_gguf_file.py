"""Our GGUF reader against the `gguf` package's: the same fields with the same values and types,
the same tensors with the same types, shapes and bytes, on the real SmolLM2 file (Q4_1, Q8_0,
F32) and on two of llama.cpp's SentencePiece vocabulary files (float scores, token types); the
BPE ones cost GGUFReader 10-17 s each, the time this reader exists to save. And a clear error on
a file that is not GGUF or is cut short."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from switchyard.engine.model.gguf_file import GGUFError, GGUFFile  # noqa: E402


def _same_as_gguf_reader(path: Path) -> GGUFFile:
    ours, ref = GGUFFile(path), gguf.GGUFReader(str(path))
    ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}  # its own header entries
    assert list(ours.fields) == list(ref_fields)
    for key, field in ref_fields.items():
        want = field.contents()
        assert ours.fields[key] == want, key
        assert type(ours.fields[key]) is type(want), key
    assert len(ours.tensors) == len(ref.tensors)
    for a, b in zip(ours.tensors, ref.tensors, strict=True):
        assert (a.name, a.tensor_type, a.shape) == (b.name, b.tensor_type, tuple(int(x) for x in b.shape))
        assert (a.data.shape, a.data.dtype) == (b.data.shape, b.data.dtype), a.name
        assert a.data.tobytes() == np.asarray(b.data).tobytes(), a.name
    return ours


def test_smollm2_reads_as_gguf_reads_it(gguf_path: Path) -> None:
    f = _same_as_gguf_reader(gguf_path)
    assert {t.tensor_type.name for t in f.tensors} >= {"Q4_1", "F32"}
    assert len(f.fields["tokenizer.ggml.tokens"]) == 49152


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_vocab_files_read_as_gguf_reads_them(name: str) -> None:
    from switchyard.datasets import DatasetError
    from switchyard.llamacpp import vocab_dir

    try:
        path = vocab_dir() / f"ggml-vocab-{name}.gguf"
    except DatasetError as e:
        pytest.skip(f"llama.cpp's vocab files are not available: {e}")
    _same_as_gguf_reader(path)


def test_not_gguf_and_truncated_files_are_refused(tmp_path: Path, gguf_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(bad)
    with gguf_path.open("rb") as fh:
        bad.write_bytes(fh.read(4096))
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(bad)
