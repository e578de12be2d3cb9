"""Feature records as ``.npz`` files (numpy arrays and plain scalars only: loading never unpickles).

A field that has a default may be absent from a file (a record written before the field existed) and may
hold ``None`` (then it is not written); it loads as its default."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, ClassVar

import numpy as np

from rvu_pipelines.atomic_write import write_stream_atomically

_SCALARS = {"str": str, "int": int, "float": float}


class NpzRecord:
    """Mixin for a dataclass of arrays and str / int / float scalars; ``_npz_skip`` names fields not stored
    (e.g. run settings) and ``_npz_keys`` the file's key for a field when it differs from the field's name."""

    _npz_skip: ClassVar[tuple[str, ...]] = ()
    _npz_keys: ClassVar[dict[str, str]] = {}

    @classmethod
    def _stored(cls) -> list[tuple[str, str, Any]]:
        return [(f.name, cls._npz_keys.get(f.name, f.name), f.type) for f in fields(cls) if f.name not in cls._npz_skip]  # type: ignore[arg-type]

    def save(self, path: str) -> None:
        values = {key: getattr(self, name) for name, key, _ in self._stored()}
        arrays = {key: value for key, value in values.items() if value is not None}
        # a cache: a file lost to a power cut is only computed again, so no fsync
        write_stream_atomically(path, lambda handle: np.savez_compressed(handle, **arrays), fsync=False)

    @classmethod
    def load(cls, path: str) -> Any:
        data = np.load(path, allow_pickle=False)
        optional = {f.name for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING}  # type: ignore[arg-type]
        values = {}
        for name, key, kind in cls._stored():
            if key not in data.files and name in optional:
                continue
            value = data[key]
            values[name] = _SCALARS[kind](value) if kind in _SCALARS else value
        return cls(**values)
