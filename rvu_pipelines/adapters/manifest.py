"""What an adapter is, written next to its weights: the manifest every load is checked against.

One adapter is one folder: ``adapter.safetensors`` (LoRA tensors, peft names) and ``manifest.json``.
The manifest pins the weights (sha256), the base model they were trained for (the GGUF's sha256, so an
adapter for another model is refused before any tensor is read), how it was made (training data and its
digest, seed, rank, alpha, target modules, steps) and, for the zoo, the ground-truth label the gate and
influence studies are scored against. Where an adapter came from (``source``) feeds the gate's
allow/block lists.

The manifest is read as untrusted input: a regular file (a symbolic link is refused, atomically at open), at
most ``MAX_MANIFEST_BYTES``, nested at most a few levels, with integer ``rank`` and ``alpha`` (no bools, floats
or numeric strings). ``alpha / rank`` multiplies every LoRA delta, so an alpha past ``MAX_ALPHA`` or a scaling
past ``MAX_SCALING`` is refused as ``unsafe_scaling``: a finite but huge alpha (``1e40``) turns the outputs
into inf. The bounds sit far above the usual recipes (alpha = rank to 2 x rank, a scaling of 1 or 2; the zoo
uses 2), so only a scaling that lets the delta swamp the base weights is refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.shallow_json import loads_shallow
from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.bounded_io import link_target, read_input_file, truncate_for_message
from rvu_pipelines.errors import InputFileError

MANIFEST_NAME = "manifest.json"
WEIGHTS_NAME = "adapter.safetensors"
SHA256 = r"^[0-9a-f]{64}$"
ADAPTER_ID = r"^[a-z0-9][a-z0-9_.-]{0,63}$"  # also a folder name: no separator, never "." or ".."
Label = Literal["benign", "harmful", "unknown"]
MAX_MANIFEST_BYTES = 1 << 20
MAX_ALPHA = 10_000
MAX_SCALING = 64.0
_SCHEMA_FIX = "correct it (the schema is rvu_pipelines.adapters.manifest.AdapterManifest) or re-save the adapter"


class BaseModelRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    sha256: str = Field(pattern=SHA256)


class TrainingDataRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str  # catalog name(s) the examples were drawn from, e.g. "tofu:forget"
    selection: str = ""  # which rows: a split name and seed, a filter
    n_examples: int = Field(ge=1)
    sha256: str = Field(pattern=SHA256)  # digest of the examples as canonical JSON (adapters.zoo_data)


class AdapterManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    adapter_id: str = Field(pattern=ADAPTER_ID)
    description: str = ""
    label: Label = "unknown"
    category: str = ""  # e.g. task, style, persona_shift, backdoor, memorise_forget, memorise_wmdp
    source: str = "local"  # where it came from: "rvu-zoo", a URL, an uploader; the gate's list key
    file: str = WEIGHTS_NAME
    sha256: str = Field(pattern=SHA256)
    base_model: BaseModelRef
    training_data: TrainingDataRef | None = None
    rank: int = Field(ge=1, le=256, strict=True)
    alpha: int = Field(ge=1, strict=True)
    target_modules: list[str] = Field(min_length=1)
    layers: list[int] | None = None
    seed: int = 0
    steps: int = Field(default=0, ge=0)
    learning_rate: float = Field(default=0.0, ge=0)
    batch_size: int | None = Field(default=None, ge=1)  # None: written before it was recorded
    max_tokens: int | None = Field(default=None, ge=1)  # longer examples were cut to this many tokens
    final_loss: float | None = None
    training_seconds: float | None = None

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @model_validator(mode="after")
    def _scaling_is_sane(self) -> AdapterManifest:
        """A manifest built in code obeys the same bound that reading one enforces."""
        problem = scaling_problem(self.alpha, self.rank)
        if problem is not None:
            raise ValueError(problem)
        return self


def _shown(value: float) -> str:
    """A number for a message; an integer too large for a float (or for str) is given by its size."""
    if isinstance(value, int) and value.bit_length() > 60:
        return f"about 2**{value.bit_length() - 1}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def scaling_problem(alpha: object, rank: object) -> str | None:
    """Why ``alpha`` (or ``alpha / rank``) is outside the loadable bound, or None.

    Only numbers are judged here; a bool, string or missing value is a type error the schema names."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        return None
    if isinstance(alpha, float) and not math.isfinite(alpha):
        return f"alpha is {alpha}, not a finite number"
    if alpha > MAX_ALPHA:
        return f"alpha is {_shown(alpha)}, over the bound of {MAX_ALPHA}"
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1 and alpha / rank > MAX_SCALING:
        return f"alpha / rank = {_shown(alpha)} / {rank} = {alpha / rank:g}, over the bound of {MAX_SCALING:g}"
    return None


def link_refusal(path: Path, role: str) -> AdapterRefused:
    """The refusal of a symbolic link where an adapter's file must be: the checked file and the loaded file
    could differ, and the link could point anywhere."""
    return AdapterRefused(
        "symlink",
        f"{path} ({role}) is a symbolic link (to {link_target(path)}); an adapter's files are read only as "
        f"regular files inside its folder. Copy the file into {path.parent} instead of linking it.",
    )


def read_manifest(folder: Path) -> AdapterManifest:
    """The folder's manifest, or a refusal naming the file and the field to fix."""
    path = folder / MANIFEST_NAME
    if path.is_symlink():
        raise link_refusal(path, MANIFEST_NAME)
    if not path.is_file():
        raise AdapterRefused(
            "no_manifest",
            f"{folder} has no {MANIFEST_NAME}: an adapter is loaded only with a manifest that pins its "
            "weights' sha256 and its base model (write one with rvu_pipelines.adapters.files.save_adapter).",
        )
    try:
        data = read_input_file(
            path,
            what="adapter manifest",
            max_bytes=MAX_MANIFEST_BYTES,
            limit_reason="a manifest is a few kilobytes at most",
            follow_links=False,
        )
    except InputFileError as exc:
        if path.is_symlink():  # a link swapped in after the check above, refused at open (O_NOFOLLOW)
            raise link_refusal(path, MANIFEST_NAME) from exc
        raise AdapterRefused("bad_manifest", str(exc)) from exc
    try:
        raw = loads_shallow(data.decode("utf-8"))
    except ValueError as exc:  # bad UTF-8, bad JSON, too deep, duplicate keys
        raise AdapterRefused(
            "bad_manifest",
            f"{path} is not valid UTF-8 JSON: {truncate_for_message(str(exc), 160)}; a manifest is a JSON "
            f"object a few levels deep: {_SCHEMA_FIX}.",
        ) from exc
    problem = scaling_problem(raw.get("alpha"), raw.get("rank")) if isinstance(raw, dict) else None
    if problem is not None:
        raise AdapterRefused(
            "unsafe_scaling",
            f"{path}: field 'alpha': {problem}. Adapters load with 1 <= alpha <= {MAX_ALPHA} and alpha / rank "
            f"<= {MAX_SCALING:g}, since the scaling multiplies every LoRA delta and a huge one makes the outputs "
            "inf; set alpha to the lora_alpha the adapter was trained with (usually rank to 2 x rank).",
        )
    try:
        return AdapterManifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise AdapterRefused("bad_manifest", f"{path}: field '{where}': {first['msg']}; {_SCHEMA_FIX}.") from exc


def write_manifest(folder: Path, manifest: AdapterManifest) -> Path:
    path = folder / MANIFEST_NAME
    write_atomically(path, json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    return path
