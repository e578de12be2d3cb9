"""Write adapters as safetensors + manifest, and check one before anything of it is loaded.

``verify_adapter`` is the file-level half of the load path (the gate in ``adapters.gate`` is the
behavioural half). It reads bytes and the safetensors header only — never unpickles — and refuses, with a
reason and a sentence naming the file and the fix:

- a folder without a valid manifest, or a weights file that is not ``.safetensors``;
- a pickle-based file (``.bin`` / ``.pt`` / ``.pkl`` / ``.ckpt``, or pickle / torch-zip magic bytes) anywhere
  in the folder, since its presence means someone expects it to be loaded;
- a symbolic link anywhere in the folder (``symlink``), so no link can pull in a file from elsewhere; the
  weights are opened once, with O_NOFOLLOW, and the bytes loaded are re-hashed, so they are the bytes checked;
- weights whose sha256 is not the manifest's (altered or truncated), a header that does not parse or does not
  describe its data (``corrupted``: nesting deeper than a few levels, a dtype / shape / offsets of the wrong
  type, offsets that overlap, leave gaps or run past the file), a manifest for another base model (GGUF
  sha256), a tensor for a module the base does not have or the manifest does not declare, a module with only
  one of its two LoRA factors, a shape that does not fit the base's layer, NaN / Inf values (also those that
  appear when a wider dtype is converted to the float32 the adapter is loaded in);
- a scaled delta ``alpha / rank * B @ A`` whose Frobenius norm is over ``MAX_DELTA_NORM`` (``unsafe_delta``):
  finite factors of 1e30 multiply to inf in the forward pass just as a huge alpha does. The bound sits hundreds
  of times above what training recipes produce (the zoo's largest is under 20), so only a delta that swamps the
  base layer is refused. An alpha outside its bound is refused with the manifest.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.manifest import (
    MANIFEST_NAME,
    WEIGHTS_NAME,
    AdapterManifest,
    BaseModelRef,
    link_refusal,
    read_manifest,
    write_manifest,
)
from rvu_pipelines.adapters.shallow_json import loads_shallow
from rvu_pipelines.atomic_write import atomic_path
from rvu_pipelines.bounded_io import truncate_for_message
from rvu_pipelines.hashing import sha256_file

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_TENSOR_NAME = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference implementation's own bound
_FLOAT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}  # LoRA weights are floats
_MAX_DIMS = 8
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
MAX_DELTA_NORM = 1e4
_WEIGHTS_FIELD = "manifest field 'file'"
_HEADER_FIX = (
    "the file is corrupted or was not written by safetensors; re-export the adapter with "
    "safetensors.torch.save_file or peft's save_pretrained(..., safe_serialization=True)"
)


@dataclass(frozen=True)
class BaseModelInfo:
    """What an adapter must fit: the base GGUF's sha256 and each linear layer's (out, in) shape."""

    name: str
    sha256: str
    linear_shapes: Mapping[str, tuple[int, int]]

    @classmethod
    def of(cls, model: Any, *, name: str, sha256: str) -> BaseModelInfo:
        import torch

        shapes = {
            module_name: (int(module.out_features), int(module.in_features))
            for module_name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear)
        }
        return cls(name=name, sha256=sha256, linear_shapes=shapes)

    @classmethod
    def from_gguf(cls, path: Path | str, *, name: str = "", sha256: str | None = None) -> BaseModelInfo:
        """From the agent's GGUF alone (no weights de-quantised): each block weight llama.cpp adapts, under the
        peft module name an adapter targets (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj``);
        GGUF lists a 2-d shape as (in, out)."""
        from rvu_pipelines.adapters.gguf_lora import peft_module_names
        from rvu_pipelines.models.gguf_header import cached_header

        by_gguf_name = cached_header(path).tensor_shapes
        shapes = {}
        for module, gguf_name in peft_module_names(
            len({n.split(".")[1] for n in by_gguf_name if n.startswith("blk.")})
        ):
            shape = by_gguf_name.get(gguf_name)
            if shape is not None and len(shape) == 2:
                shapes[module] = (shape[1], shape[0])
        return cls(name=name or Path(path).name, sha256=sha256 or sha256_file(Path(path)), linear_shapes=shapes)

    @property
    def ref(self) -> BaseModelRef:
        return BaseModelRef(name=self.name, sha256=self.sha256)


@dataclass(frozen=True)
class VerifiedAdapter:
    """An adapter folder that passed every file check: its manifest and its tensors (float32, CPU)."""

    folder: Path
    manifest: AdapterManifest
    tensors: dict[str, Any]

    @property
    def adapter_id(self) -> str:
        return self.manifest.adapter_id

    @property
    def sha256(self) -> str:
        return self.manifest.sha256


def save_adapter(
    folder: Path,
    tensors: Mapping[str, Any],
    manifest_fields: Mapping[str, Any],
    *,
    base: BaseModelInfo,
) -> AdapterManifest:
    """``adapter.safetensors`` + ``manifest.json`` in ``folder``; the manifest's sha256 is the written file's."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / WEIGHTS_NAME
    contiguous = {name: tensor.detach().contiguous().cpu() for name, tensor in sorted(tensors.items())}
    with atomic_path(weights) as partial:  # never half a file, never written through a link planted there
        save_file(contiguous, str(partial), metadata={"format": "pt", "base_model_sha256": base.sha256})
    manifest = AdapterManifest.model_validate(
        {**manifest_fields, "file": WEIGHTS_NAME, "sha256": sha256_file(weights), "base_model": base.ref.model_dump()}
    )
    write_manifest(folder, manifest)
    return manifest


def _refuse_pickles(folder: Path, files: Iterable[Path]) -> None:
    for path in files:
        if path.suffix.lower() in PICKLE_SUFFIXES or _looks_pickled(path):
            raise AdapterRefused(
                "pickle_file",
                f"{path} is a pickle-based weights file; adapters are loaded from safetensors only, since "
                "unpickling runs code. Convert it (peft: save_pretrained(..., safe_serialization=True)) and "
                f"remove {path.name} from {folder}.",
            )


def _looks_pickled(path: Path) -> bool:
    """Pickle (protocol 2-5) or torch-zip magic. A safetensors header length can begin with the same two bytes
    (640 = 80 02 ...), so a file whose first 8 bytes are a length that fits the file followed by "{" is not one."""
    if not path.is_file():
        return False
    with path.open("rb") as handle:
        head = handle.read(9)
    if len(head) == 9 and head[8:9] == b"{" and 2 <= struct.unpack("<Q", head[:8])[0] <= path.stat().st_size - 8:
        return False
    return head[:1] == b"\x80" and head[1:2] in {b"\x02", b"\x03", b"\x04", b"\x05"} or head[:4] == b"PK\x03\x04"


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened without following a link (O_NOFOLLOW, so a link swapped in after the checks is refused
    too) or blocking on a FIFO; a regular file, or a refusal."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise link_refusal(path, _WEIGHTS_FIELD) from exc
        raise AdapterRefused("corrupted", f"{path} ({_WEIGHTS_FIELD}) cannot be opened: {exc.strerror}.") from exc
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise AdapterRefused(
            "corrupted", f"{path} ({_WEIGHTS_FIELD}) is not a regular file; put the .safetensors file itself there."
        )
    return handle


def _bad_header(path: Path, where: str, problem: str) -> AdapterRefused:
    return AdapterRefused("corrupted", f"{path}: safetensors header, {where}: {problem}; {_HEADER_FIX}.")


def _is_count(value: object) -> bool:
    """A non-negative JSON integer; ``bool`` is an ``int`` in Python and must not pass for 0 or 1."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry_span(path: Path, name: str, entry: object, data_size: int) -> tuple[int, int]:
    """A tensor's ``(begin, end)`` in the data section, once its dtype, shape and offsets agree with each other."""
    where = f"tensor {truncate_for_message(name, 80)}"
    if not isinstance(entry, dict):
        raise _bad_header(path, where, f"is {truncate_for_message(entry, 60)}, not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _FLOAT_BYTES:
        allowed = ", ".join(_FLOAT_BYTES)
        problem = f"is {truncate_for_message(dtype, 60)}, not a floating-point dtype ({allowed})"
        raise _bad_header(path, f"{where} field 'dtype'", problem)
    if not (isinstance(shape, list) and len(shape) <= _MAX_DIMS and all(_is_count(dim) for dim in shape)):
        problem = f"is {truncate_for_message(shape, 60)}, not a list of at most {_MAX_DIMS} non-negative integers"
        raise _bad_header(path, f"{where} field 'shape'", problem)
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(_is_count(offset) for offset in offsets)
        and offsets[0] <= offsets[1] <= data_size
    ):
        problem = (
            f"is {truncate_for_message(offsets, 60)}, not [begin, end]: two integers with "
            f"0 <= begin <= end <= {data_size} (the data section's length)"
        )
        raise _bad_header(path, f"{where} field 'data_offsets'", problem)
    begin, end = offsets
    nbytes = 0 if 0 in shape else _FLOAT_BYTES[dtype]
    for dim in shape:
        nbytes *= dim
        if nbytes > data_size:  # stop before a hostile shape makes a huge integer
            break
    if nbytes != end - begin:
        problem = f"spans {end - begin} bytes, but a {dtype} tensor of shape {shape} takes {nbytes}"
        raise _bad_header(path, f"{where} field 'data_offsets'", problem)
    return begin, end


def _read_header(path: Path, handle: BinaryIO | None = None) -> dict[str, Any]:
    """The safetensors JSON header, checked as safetensors itself would before any tensor is read: its length
    against the file's, its nesting, each entry's types, and offsets that tile the data section exactly."""
    if handle is None:
        with _open_regular(path) as opened:
            return _read_header(path, opened)
    size = os.fstat(handle.fileno()).st_size
    handle.seek(0)
    prefix = handle.read(8)
    if len(prefix) < 8:
        raise AdapterRefused("corrupted", f"{path} is {size} bytes: too short to be a safetensors file.")
    (length,) = struct.unpack("<Q", prefix)
    if length > min(_MAX_HEADER, size - 8):
        raise AdapterRefused("corrupted", f"{path}: header length {length} does not fit a {size}-byte file.")
    try:
        header = loads_shallow(handle.read(length).decode("utf-8"))
    except ValueError as exc:  # bad UTF-8, bad JSON, too deep, duplicate keys, overlong integers
        raise AdapterRefused(
            "corrupted",
            f"{path}: the safetensors header is not valid JSON ({truncate_for_message(str(exc), 160)}); {_HEADER_FIX}.",
        ) from exc
    if not isinstance(header, dict):
        raise AdapterRefused("corrupted", f"{path}: the safetensors header is not a JSON object; {_HEADER_FIX}.")
    data_size = size - 8 - length
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not (isinstance(entry, dict) and all(isinstance(value, str) for value in entry.values())):
                raise _bad_header(path, "field '__metadata__'", "must be an object of strings")
            continue
        spans.append((*_entry_span(path, name, entry, data_size), name))
    covered = 0
    for begin, end, name in sorted(spans):
        if begin != covered:
            problem = f"begins at byte {begin}, where the tensors before it end at {covered}: overlap or gap"
            raise _bad_header(path, f"tensor {truncate_for_message(name, 80)} field 'data_offsets'", problem)
        covered = end
    if covered != data_size:
        raise _bad_header(path, "data section", f"is {data_size} bytes, but its tensors cover {covered}")
    return header


def _declared_layers(path: Path, manifest: AdapterManifest, base: BaseModelInfo) -> set[int] | None:
    """The manifest's ``layers`` (None: every layer), each one a layer the base has."""
    if manifest.layers is None:
        return None
    present = {int(m.group(1)) for m in map(_LAYER.match, base.linear_shapes) if m is not None}
    unknown = sorted(set(manifest.layers) - present)
    if not manifest.layers or unknown:
        problem = (
            f"lists {truncate_for_message(unknown, 60)}, not layers of {base.name} (0-{max(present, default=0)})"
            if unknown
            else "is an empty list"
        )
        raise AdapterRefused(
            "bad_manifest",
            f"{path.parent / MANIFEST_NAME}: field 'layers' {problem}; list the layers the adapter was trained on, "
            "or null for all of them.",
        )
    return set(manifest.layers)


def _check_shapes(path: Path, header: Mapping[str, Any], manifest: AdapterManifest, base: BaseModelInfo) -> None:
    targets = set(manifest.target_modules)
    names = [name for name in header if name != "__metadata__"]
    if not names:
        raise AdapterRefused("corrupted", f"{path} holds no tensors.")
    parts: dict[str, set[str]] = {}
    declared_layers = _declared_layers(path, manifest, base)
    for name in names:
        match = _TENSOR_NAME.match(name)
        module = match.group("module") if match else None
        if module is None or module not in base.linear_shapes or module.rsplit(".", 1)[-1] not in targets:
            declared = ", ".join(sorted(targets))
            raise AdapterRefused(
                "unknown_target_module",
                f"{path}: tensor '{name}' targets a module that {base.name} does not have or that the manifest "
                f"does not declare (target_modules: {declared}); it was trained for another architecture or "
                "the manifest is wrong.",
            )
        assert match is not None
        layer = _LAYER.match(module)
        if declared_layers is not None and (layer is None or int(layer.group(1)) not in declared_layers):
            raise AdapterRefused(
                "unknown_target_module",
                f"{path}: tensor '{name}' is outside the manifest's field 'layers' ({sorted(declared_layers)}); a "
                "runtime that adapts only the declared layers would run another adapter than the file holds. List "
                "every layer the weights adapt, or leave 'layers' null.",
            )
        parts.setdefault(module, set()).add(match.group("part"))
        shape = header[name].get("shape")
        out_features, in_features = base.linear_shapes[module]
        expected = [manifest.rank, in_features] if match.group("part") == "A" else [out_features, manifest.rank]
        if shape != expected:
            raise AdapterRefused(
                "shape_mismatch",
                f"{path}: tensor '{name}' has shape {shape}, {base.name}'s layer needs {expected} at rank "
                f"{manifest.rank}; the adapter was trained for another base model (or another rank).",
            )
    for module, found in sorted(parts.items()):
        if found != {"A", "B"}:
            (present,) = found
            missing = "B" if present == "A" else "A"
            raise AdapterRefused(
                "corrupted",
                f"{path}: module '{module}' has lora_{present} but no lora_{missing}; a LoRA delta is B @ A, so "
                "each targeted module needs both factors. Re-export the adapter with peft's save_pretrained.",
            )


def _check_deltas(path: Path, tensors: Mapping[str, Any], scaling: float) -> None:
    """Refuse a scaled delta over ``MAX_DELTA_NORM``; ``||B @ A||_F`` is read through the rank x rank Gram
    matrices in float64, so neither the full delta nor an overflow is ever formed."""
    import torch

    for name, a in sorted(tensors.items()):
        match = _TENSOR_NAME.match(name)
        if match is None or match.group("part") != "A":
            continue
        a64 = a.double()
        b64 = tensors[name.replace(".lora_A.", ".lora_B.")].double()
        norm = scaling * float(torch.sqrt(torch.trace((b64.T @ b64) @ (a64 @ a64.T)).clamp(min=0)))
        if not norm <= MAX_DELTA_NORM:  # also refuses a NaN norm
            raise AdapterRefused(
                "unsafe_delta",
                f"{path}: module '{match.group('module')}': alpha / rank * B @ A has Frobenius norm {norm:.3g}, over "
                f"the bound of {MAX_DELTA_NORM:g}; a delta that large swamps the base layer and drives the outputs "
                "to inf. Trained LoRA deltas are a few units: re-export the weights the adapter was trained with.",
            )


def _sha256(handle: BinaryIO) -> str:
    digest = hashlib.sha256()
    handle.seek(0)
    while chunk := handle.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def verify_adapter(folder: str | Path, base: BaseModelInfo) -> VerifiedAdapter:
    """Every file-level check, then the tensors; raises ``AdapterRefused`` at the first failure."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load

    root = Path(folder)
    if root.is_file():
        _refuse_pickles(root.parent, [root])
        raise AdapterRefused(
            "no_manifest", f"{root} is a bare file; load an adapter folder holding {WEIGHTS_NAME} and {MANIFEST_NAME}."
        )
    if not root.is_dir():
        raise AdapterRefused("no_manifest", f"No adapter folder at {root}.")
    entries = sorted(root.iterdir())
    roles = {MANIFEST_NAME: "the adapter's manifest", WEIGHTS_NAME: "the adapter's weights"}
    for path in entries:
        if path.is_symlink():
            raise link_refusal(path, roles.get(path.name, "a file in the adapter folder"))
    _refuse_pickles(root, [p for p in entries if p.is_file() and p.name != MANIFEST_NAME])
    manifest = read_manifest(root)
    weights = root / manifest.file
    if weights.suffix != ".safetensors" or weights.parent != root:
        raise AdapterRefused(
            "not_safetensors", f"{root}/manifest.json: field 'file' must name a .safetensors file in the folder."
        )
    if weights.is_symlink():
        raise link_refusal(weights, _WEIGHTS_FIELD)
    if not weights.is_file():
        raise AdapterRefused("corrupted", f"{weights} is missing ({_WEIGHTS_FIELD}).")
    if manifest.base_model.sha256 != base.sha256:
        raise AdapterRefused(
            "other_base_model",
            f"{root}: trained for base model {manifest.base_model.name} (sha256 {manifest.base_model.sha256[:12]}…), "
            f"this agent runs {base.name} (sha256 {base.sha256[:12]}…); LoRA deltas only mean something on "
            "the weights they were trained on.",
        )
    with _open_regular(weights) as handle:
        size = os.fstat(handle.fileno()).st_size
        actual = _sha256(handle)
        if actual != manifest.sha256:
            raise AdapterRefused(
                "sha256_mismatch",
                f"{weights}: sha256 {actual[:12]}… is not the manifest's {manifest.sha256[:12]}…; the file was "
                "altered or truncated after it was written.",
            )
        header = _read_header(weights, handle)
        _check_shapes(weights, header, manifest, base)
        handle.seek(0)
        data = handle.read(size)  # the header tiled these bytes with tensors of the base's shapes
    if hashlib.sha256(data).hexdigest() != manifest.sha256:
        raise AdapterRefused(
            "sha256_mismatch", f"{weights} changed while it was being checked; verify the adapter again."
        )
    try:
        tensors = load(data)
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterRefused("corrupted", f"{weights} does not load as safetensors: {exc}") from exc
    loaded = {}
    for name, tensor in sorted(tensors.items()):
        as_float = tensor.float()  # the dtype every runtime loads the adapter in
        if not torch.isfinite(as_float).all():
            widened = "" if not torch.isfinite(tensor).all() else f" once its {tensor.dtype} values are cast to float32"
            raise AdapterRefused(
                "non_finite",
                f"{weights}: tensor '{name}' holds NaN or Inf values{widened}; re-export the weights the adapter "
                "was trained with.",
            )
        loaded[name] = as_float
    _check_deltas(weights, loaded, manifest.scaling)
    return VerifiedAdapter(folder=root, manifest=manifest, tensors=loaded)
