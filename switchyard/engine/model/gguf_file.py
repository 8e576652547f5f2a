"""A GGUF file's metadata as plain Python values and its tensors as memory-mapped numpy views.

Why not `gguf.GGUFReader`: it builds a numpy memmap slice for every part of every field, and a
tokenizer's field holds 49k-150k strings. Measured on SmolLM2-135M's file it takes 2.0 s, on
llama.cpp's llama-bpe vocabulary 10.6 s (2 cores); every engine rank, `switchyard up` check and
tokenizer load paid it. Reading the header with `struct` and numeric arrays with one
`np.frombuffer` each takes a few tens of milliseconds. The `gguf` package stays the reference
(tests compare the two field by field and byte by byte) and still owns the quant tables and
dequantization.

Format (little-endian, versions 2 and 3): magic, version, tensor count, field count; the fields
(key, type, value); the tensor infos (name, dims, type, offset); padding to `general.alignment`;
the tensor data.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_MAGIC = 0x46554747  # b"GGUF" read as a little-endian uint32
_DEFAULT_ALIGNMENT = 32

# GGUF value types -> numpy dtypes (8 is a string, 9 an array); scalars and arrays alike.
_DTYPES: dict[int, np.dtype] = {k: np.dtype(v) for k, v in {
    0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}.items()}
_STRING, _ARRAY = 8, 9
# Tensor types stored as plain elements (every other type is quantized blocks, read as bytes).
_ELEMENT_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}


class GGUFError(ValueError):
    pass


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: innermost dimension first
    data: np.ndarray  # read-only view into the mapped file, shaped as gguf.GGUFReader shapes it


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, code: str) -> Any:
        fmt = "<" + code
        try:
            (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise GGUFError(f"{self.path}: truncated GGUF header at byte {self.pos}") from None
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.unpack("Q")
        end = self.pos + n
        if end > len(self.buf):
            raise GGUFError(f"{self.path}: truncated GGUF string at byte {self.pos}")
        s = str(self.buf[self.pos:end], "utf-8")
        self.pos = end
        return s

    def numbers(self, dt: np.dtype, count: int) -> list:
        end = self.pos + count * dt.itemsize
        if end > len(self.buf):
            raise GGUFError(f"{self.path}: truncated GGUF value at byte {self.pos}")
        arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
        self.pos = end
        return arr.tolist()

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("I"), self.unpack("Q")
            if etype in _DTYPES:
                return self.numbers(_DTYPES[etype], count)
            return [self.value(etype) for _ in range(count)]
        if vtype not in _DTYPES:
            raise GGUFError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")
        return self.numbers(_DTYPES[vtype], 1)[0]


class GGUFFile:
    """`fields` maps each key to its value (str, int, float, bool or a list of them);
    `tensors` lists the tensors in file order. The file stays mapped while this object lives."""

    def __init__(self, path: str | Path) -> None:
        import gguf  # the quant tables: block and type sizes per GGML type

        self.path = Path(path)
        with open(self.path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        buf = memoryview(self._map)
        cur = _Cursor(buf, self.path)
        if len(buf) < 24 or cur.unpack("I") != _MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (bad magic)")
        version = cur.unpack("I")
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {version} is not supported (2 and 3 are)")
        n_tensors, n_fields = cur.unpack("Q"), cur.unpack("Q")
        self.version = version
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = cur.string()
            self.fields[key] = cur.value(cur.unpack("I"))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(cur.unpack("Q") for _ in range(cur.unpack("I")))
            infos.append((name, dims, cur.unpack("I"), cur.unpack("Q")))
        align = self.fields.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise GGUFError(f"{self.path}: general.alignment must be a power of two, got {align!r}")
        start = -(-cur.pos // align) * align
        self.tensors: list[GGUFTensor] = []
        for name, dims, ttype, offset in infos:
            qtype = gguf.GGMLQuantizationType(ttype)
            n = int(np.prod(dims)) if dims else 1
            np_dims = tuple(reversed(dims))
            elem = _ELEMENT_DTYPES.get(qtype.name)
            if elem is not None:
                dt, count = np.dtype(elem), n
            else:
                block, type_size = gguf.GGML_QUANT_SIZES[qtype]
                dt, count = np.dtype(np.uint8), n * type_size // block
                np_dims = gguf.quants.quant_shape_to_byte_shape(np_dims, qtype)
            at = start + offset
            if at + count * dt.itemsize > len(buf):
                raise GGUFError(f"{self.path}: tensor {name} runs past the end of the file")
            data = np.frombuffer(buf, dtype=dt, count=count, offset=at).reshape(np_dims)
            self.tensors.append(GGUFTensor(name, qtype, dims, data))
