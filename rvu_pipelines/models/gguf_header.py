"""A GGUF file's header without its weights or vocabulary: scalar and string metadata, and each tensor's shape.

``gguf.GGUFReader`` builds every field first, arrays included, which is several seconds for a 49k-entry
vocabulary; the platform asks a base model only for a template, a head count or its linear shapes, so this reader
skips arrays by their lengths and stops at the tensor table. Versions 2 and 3 in either byte order are read, as
llama.cpp reads them; anything else is a ``ValueError`` (an ``OSError`` when the file cannot be opened).
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import gguf

_SCALARS: dict[int, str] = {
    gguf.GGUFValueType.UINT8: "B",
    gguf.GGUFValueType.INT8: "b",
    gguf.GGUFValueType.UINT16: "H",
    gguf.GGUFValueType.INT16: "h",
    gguf.GGUFValueType.UINT32: "I",
    gguf.GGUFValueType.INT32: "i",
    gguf.GGUFValueType.FLOAT32: "f",
    gguf.GGUFValueType.BOOL: "?",
    gguf.GGUFValueType.UINT64: "Q",
    gguf.GGUFValueType.INT64: "q",
    gguf.GGUFValueType.FLOAT64: "d",
}

Scalar = int | float | bool | str
MAX_DIMS = 4  # GGML_MAX_DIMS: a tensor's shape has at most four dimensions


@dataclass(frozen=True)
class GgufHeader:
    """``metadata``: every scalar and string value by key (arrays are skipped); ``tensor_shapes``: each tensor's
    dimensions in GGUF order (innermost first, so a 2-d weight reads (in, out)), as ``GGUFReader`` reports them."""

    version: int
    metadata: dict[str, Scalar]
    tensor_shapes: dict[str, tuple[int, ...]]


class _Cursor:
    def __init__(self, data: mmap.mmap, order: str) -> None:
        self.data, self.order, self.offset = data, order, 0

    def unpack(self, fmt: str) -> tuple[int | float | bool, ...]:
        values = struct.unpack_from(self.order + fmt, self.data, self.offset)
        self.offset += struct.calcsize(self.order + fmt)
        return values

    def string(self) -> str:
        (size,) = self.unpack("Q")
        end = self.offset + int(size)
        if end > len(self.data):
            raise ValueError("a string runs past the end of the file")
        text = self.data[self.offset : end].decode("utf-8")
        self.offset = end
        return text

    def value(self, kind: int) -> Scalar | None:
        """The value of type ``kind`` at the cursor (None for an array, which is skipped)."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])[0]
        if kind == gguf.GGUFValueType.STRING:
            return self.string()
        if kind == gguf.GGUFValueType.ARRAY:
            item, count = self.unpack("IQ")
            if item in _SCALARS:
                self.offset += int(count) * struct.calcsize(self.order + _SCALARS[int(item)])
            else:
                for _ in range(int(count)):
                    self.value(int(item))
            return None
        raise ValueError(f"unknown metadata value type {kind}")


def read_header(path: Path | str) -> GgufHeader:
    """The header of the GGUF at ``path`` (see the module docstring for what is read and what is refused)."""
    with Path(path).open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            if len(data) < 24 or struct.unpack_from("<I", data, 0)[0] != gguf.GGUF_MAGIC:
                raise ValueError("not a GGUF file (no GGUF magic)")
            order = "<" if struct.unpack_from("<I", data, 4)[0] & 0xFFFF else ">"
            cursor = _Cursor(data, order)
            cursor.offset = 4
            version, tensor_count, kv_count = (int(v) for v in cursor.unpack("IQQ"))
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version} (2 and 3 are read)")
            metadata: dict[str, Scalar] = {}
            for _ in range(kv_count):
                key = cursor.string()
                (kind,) = cursor.unpack("I")
                value = cursor.value(int(kind))
                if value is not None:
                    metadata[key] = value
            shapes: dict[str, tuple[int, ...]] = {}
            for _ in range(tensor_count):
                name = cursor.string()
                (dims,) = cursor.unpack("I")
                if not 0 < int(dims) <= MAX_DIMS:
                    raise ValueError(f"tensor {name!r} has {dims} dimensions (GGML allows 1 to {MAX_DIMS})")
                shapes[name] = tuple(int(d) for d in cursor.unpack("Q" * int(dims)))
                cursor.unpack("IQ")  # the tensor's type and data offset
        except struct.error as exc:
            raise ValueError(f"the header is cut short ({exc})") from exc
        except RecursionError as exc:  # arrays of arrays nested past any real file's depth
            raise ValueError("the metadata nests arrays too deeply") from exc
    return GgufHeader(version=version, metadata=metadata, tensor_shapes=shapes)


@functools.lru_cache(maxsize=16)
def _cached(path: str, size: int, mtime_ns: int) -> GgufHeader:
    return read_header(path)


def cached_header(path: Path | str) -> GgufHeader:
    """``read_header`` once per process and file version (keyed on the resolved path, size and modification
    time, so a replaced file is read again). The result is shared: treat it as read-only."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return _cached(str(resolved), stat.st_size, stat.st_mtime_ns)
