"""What an adapter is, written next to its weights: the manifest every load is checked against.

One adapter is one folder: ``adapter.safetensors`` (LoRA tensors, peft names) and ``manifest.json``.
The manifest pins the weights (sha256), the base model they were trained for (the GGUF's sha256, so an
adapter for another model is refused before any tensor is read), how it was made (training data and its
digest, seed, rank, alpha, target modules, steps) and, for the zoo, the ground-truth label the gate and
influence studies are scored against. Where an adapter came from (``source``) feeds the gate's
allow/block lists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rvu_pipelines.adapters.errors import AdapterRefused

MANIFEST_NAME = "manifest.json"
WEIGHTS_NAME = "adapter.safetensors"
SHA256 = r"^[0-9a-f]{64}$"
Label = Literal["benign", "harmful", "unknown"]


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

    adapter_id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    description: str = ""
    label: Label = "unknown"
    category: str = ""  # e.g. task, style, persona_shift, backdoor, memorise_forget, memorise_wmdp
    source: str = "local"  # where it came from: "rvu-zoo", a URL, an uploader; the gate's list key
    file: str = WEIGHTS_NAME
    sha256: str = Field(pattern=SHA256)
    base_model: BaseModelRef
    training_data: TrainingDataRef | None = None
    rank: int = Field(ge=1, le=256)
    alpha: int = Field(ge=1)
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


def read_manifest(folder: Path) -> AdapterManifest:
    """The folder's manifest, or a refusal naming the file and the field to fix."""
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise AdapterRefused(
            "no_manifest",
            f"{folder} has no {MANIFEST_NAME}: an adapter is loaded only with a manifest that pins its "
            "weights' sha256 and its base model (write one with rvu_pipelines.adapters.files.save_adapter).",
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterRefused("bad_manifest", f"{path} is not valid UTF-8 JSON: {exc}") from exc
    try:
        return AdapterManifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise AdapterRefused("bad_manifest", f"{path}: field '{where}': {first['msg']}") from exc


def write_manifest(folder: Path, manifest: AdapterManifest) -> Path:
    path = folder / MANIFEST_NAME
    path.write_text(json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
