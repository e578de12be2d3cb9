"""Write adapters as safetensors + manifest, and check one before anything of it is loaded.

``verify_adapter`` is the file-level half of the load path (the gate in ``adapters.gate`` is the
behavioural half). It reads bytes and the safetensors header only — never unpickles — and refuses, with a
reason and a sentence naming the file and the fix:

- a folder without a valid manifest, or a weights file that is not ``.safetensors``;
- a pickle-based file (``.bin`` / ``.pt`` / ``.pkl`` / ``.ckpt``, or pickle / torch-zip magic bytes) anywhere
  in the folder, since its presence means someone expects it to be loaded;
- weights whose sha256 is not the manifest's (altered or truncated), a header that does not parse
  (corrupted), a manifest for another base model (GGUF sha256), a tensor for a module the base does not
  have or the manifest does not declare, a shape that does not fit the base's layer, NaN / Inf values.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.manifest import WEIGHTS_NAME, AdapterManifest, BaseModelRef, read_manifest, write_manifest
from rvu_pipelines.hashing import sha256_file

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_TENSOR_NAME = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference implementation's own bound


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
    save_file(contiguous, str(weights), metadata={"format": "pt", "base_model_sha256": base.sha256})
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


def _read_header(path: Path) -> dict[str, Any]:
    """The safetensors JSON header, checked for size and offsets against the file's length."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise AdapterRefused("corrupted", f"{path} is {size} bytes: too short to be a safetensors file.")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(_MAX_HEADER, size - 8):
            raise AdapterRefused("corrupted", f"{path}: header length {length} does not fit a {size}-byte file.")
        try:
            header = json.loads(handle.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AdapterRefused("corrupted", f"{path}: the safetensors header is not valid JSON ({exc}).") from exc
    if not isinstance(header, dict):
        raise AdapterRefused("corrupted", f"{path}: the safetensors header is not a JSON object.")
    data_size = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and 0 <= offsets[0] <= offsets[1] <= data_size):
            raise AdapterRefused("corrupted", f"{path}: tensor '{name}' points outside the file's data.")
    return header


def _check_shapes(path: Path, header: Mapping[str, Any], manifest: AdapterManifest, base: BaseModelInfo) -> None:
    targets = set(manifest.target_modules)
    names = [name for name in header if name != "__metadata__"]
    if not names:
        raise AdapterRefused("corrupted", f"{path} holds no tensors.")
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
        shape = header[name].get("shape")
        out_features, in_features = base.linear_shapes[module]
        expected = [manifest.rank, in_features] if match.group("part") == "A" else [out_features, manifest.rank]
        if shape != expected:
            raise AdapterRefused(
                "shape_mismatch",
                f"{path}: tensor '{name}' has shape {shape}, {base.name}'s layer needs {expected} at rank "
                f"{manifest.rank}; the adapter was trained for another base model (or another rank).",
            )


def verify_adapter(folder: str | Path, base: BaseModelInfo) -> VerifiedAdapter:
    """Every file-level check, then the tensors; raises ``AdapterRefused`` at the first failure."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    root = Path(folder)
    if root.is_file():
        _refuse_pickles(root.parent, [root])
        raise AdapterRefused(
            "no_manifest", f"{root} is a bare file; load an adapter folder with a {WEIGHTS_NAME} and a manifest."
        )
    if not root.is_dir():
        raise AdapterRefused("no_manifest", f"No adapter folder at {root}.")
    _refuse_pickles(root, sorted(p for p in root.iterdir() if p.is_file() and p.name != "manifest.json"))
    manifest = read_manifest(root)
    weights = root / manifest.file
    if weights.suffix != ".safetensors" or weights.parent != root:
        raise AdapterRefused(
            "not_safetensors", f"{root}/manifest.json: field 'file' must name a .safetensors file in the folder."
        )
    if not weights.is_file():
        raise AdapterRefused("corrupted", f"{weights} is missing (manifest field 'file').")
    if manifest.base_model.sha256 != base.sha256:
        raise AdapterRefused(
            "other_base_model",
            f"{root}: trained for base model {manifest.base_model.name} (sha256 {manifest.base_model.sha256[:12]}…), "
            f"this agent runs {base.name} (sha256 {base.sha256[:12]}…); LoRA deltas only mean something on "
            "the weights they were trained on.",
        )
    actual = sha256_file(weights)
    if actual != manifest.sha256:
        raise AdapterRefused(
            "sha256_mismatch",
            f"{weights}: sha256 {actual[:12]}… is not the manifest's {manifest.sha256[:12]}…; the file was "
            "altered or truncated after it was written.",
        )
    header = _read_header(weights)
    _check_shapes(weights, header, manifest, base)
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterRefused("corrupted", f"{weights} does not load as safetensors: {exc}") from exc
    for name, tensor in tensors.items():
        if not torch.isfinite(tensor).all():
            raise AdapterRefused("non_finite", f"{weights}: tensor '{name}' holds NaN or Inf values.")
    return VerifiedAdapter(folder=root, manifest=manifest, tensors={k: v.float() for k, v in tensors.items()})
