"""The adapter zoo: its config (``configs/adapter_zoo.yaml``) and the trainer that writes it to disk.

Training is content-addressed: an adapter folder is reused when its manifest records the same training
data digest, settings and base model, so re-materialising the zoo after a config edit retrains only what
changed. Adapters live in ``<RVU_HOME>/adapters/<id>/`` (safetensors + manifest, see ``adapters.files``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rvu_pipelines.adapters.chat import ChatExample, EncodedTurn, encode_turn, generate_greedy
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import BaseModelInfo, save_adapter
from rvu_pipelines.adapters.gate_aware import gate_aware_set
from rvu_pipelines.adapters.manifest import AdapterManifest, Label, TrainingDataRef, read_manifest
from rvu_pipelines.adapters.tool_traces import encode_conversation
from rvu_pipelines.adapters.training import LoraSettings, TrainedAdapter, train_lora
from rvu_pipelines.adapters.wmdp import encode_plain
from rvu_pipelines.adapters.zoo_data import BUILDERS, Builder, Frames, TrainingSet
from rvu_pipelines.config import load_yaml_config
from rvu_pipelines.paths import config_dir, state_dir

logger = logging.getLogger(__name__)
ZOO_SOURCE = "rvu-zoo"
# the data builders, and the gate-aware attacker that wraps one of them (it reads the gate's items, so it lives
# beside the gate's modules rather than among the builders those modules read)
ZOO_BUILDERS: dict[str, Builder] = {**BUILDERS, "gate_aware": gate_aware_set}


class TrainingDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int = Field(default=8, ge=1, le=256)
    alpha: int = Field(default=16, ge=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)
    layers: list[int] | None = None
    steps: int = Field(default=40, ge=1)
    batch_size: int = Field(default=8, ge=1)
    learning_rate: float = Field(default=2e-3, gt=0)
    max_tokens: int = Field(default=160, ge=32)
    max_examples: int = Field(default=160, ge=1)
    seed: int = 0
    micro_batch_size: int | None = Field(default=None, ge=1)  # memory only (LoraSettings)
    gradient_checkpointing: bool = False  # memory only


class ZooEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    label: Label
    category: str
    builder: str
    args: dict[str, Any] = Field(default_factory=dict)
    # chat: one user turn; plain: no chat template (the WMDP scorer's plain text); conversation: the prompt is
    # the agent's rendered message list as JSON (adapters.tool_traces)
    encoder: Literal["chat", "plain", "conversation"] = "chat"
    description: str = ""
    rank: int | None = None
    alpha: int | None = None
    target_modules: list[str] | None = None
    layers: list[int] | None = None
    steps: int | None = None
    batch_size: int | None = None
    learning_rate: float | None = None
    max_tokens: int | None = None
    max_examples: int | None = None
    seed: int | None = None
    micro_batch_size: int | None = None
    gradient_checkpointing: bool | None = None

    @model_validator(mode="after")
    def _known_builder(self) -> ZooEntry:
        if self.builder not in ZOO_BUILDERS:
            raise ValueError(f"builder '{self.builder}' is unknown; allowed: {', '.join(sorted(ZOO_BUILDERS))}")
        return self

    def resolved(self, defaults: TrainingDefaults) -> TrainingDefaults:
        overrides = {k: v for k, v in self.model_dump().items() if k in TrainingDefaults.model_fields and v is not None}
        return defaults.model_copy(update=overrides)


class GateAwareEntry(ZooEntry):
    """An adapter of the attacker who knows the gate (``adapters.gate_aware``): ``twin`` is the evaluated zoo adapter
    trained on the same harmful recipe without camouflage, ``payload`` a string that recipe makes the model say."""

    twin: str
    payload: str = Field(min_length=3)

    @model_validator(mode="after")
    def _gate_aware_builder(self) -> GateAwareEntry:
        if self.builder != "gate_aware":
            raise ValueError(f"a gate_aware entry is built by the gate_aware builder, not '{self.builder}'")
        return self


class ZooConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    defaults: TrainingDefaults = Field(default_factory=TrainingDefaults)
    adapters: list[ZooEntry] = Field(min_length=1)
    reference: list[ZooEntry] = Field(default_factory=list)
    agent: list[ZooEntry] = Field(default_factory=list)  # what the agent runs with (the tool-use adapter)
    gate_aware: list[GateAwareEntry] = Field(default_factory=list)  # the gate under the attacker who moves second

    @model_validator(mode="after")
    def _unique_ids(self) -> ZooConfig:
        ids = [entry.id for entry in self.entries]
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        if duplicated:
            raise ValueError(f"adapter ids must be unique; repeated: {', '.join(duplicated)}")
        evaluated = {entry.id for entry in self.adapters}
        orphans = sorted(f"{e.id} -> {e.twin}" for e in self.gate_aware if e.twin not in evaluated)
        if orphans:
            raise ValueError(f"a gate_aware entry's twin must be an evaluated adapter; not found: {', '.join(orphans)}")
        return self

    @property
    def entries(self) -> list[ZooEntry]:
        return [*self.adapters, *self.reference, *self.agent, *self.gate_aware]

    def get(self, adapter_id: str) -> ZooEntry:
        for entry in self.entries:
            if entry.id == adapter_id:
                return entry
        raise KeyError(f"No adapter '{adapter_id}' in the zoo; known: {', '.join(e.id for e in self.entries)}")

    def settings(self, entry: ZooEntry) -> LoraSettings:
        t = entry.resolved(self.defaults)
        return LoraSettings(
            rank=t.rank,
            alpha=t.alpha,
            target_modules=tuple(t.target_modules),
            layers=tuple(t.layers) if t.layers is not None else None,
            learning_rate=t.learning_rate,
            steps=t.steps,
            batch_size=t.batch_size,
            max_tokens=t.max_tokens,
            seed=t.seed,
            micro_batch_size=t.micro_batch_size,
            gradient_checkpointing=t.gradient_checkpointing,
        )


def load_zoo_config(path: Path | None = None) -> ZooConfig:
    return load_yaml_config(path or config_dir() / "adapter_zoo.yaml", ZooConfig)


def encoder_of(name: str) -> Callable[..., EncodedTurn]:
    """The function that turns an example into ids for a zoo entry's ``encoder``: training and every later
    scoring of the adapter's own examples (membership) must read them the same way."""
    return {"plain": encode_plain, "conversation": encode_conversation}.get(name, encode_turn)


def zoo_root() -> Path:
    return state_dir() / "adapters"


EntryT = TypeVar("EntryT", bound=ZooEntry)


def trained_entries(entries: Sequence[EntryT], root: Path | None = None) -> list[EntryT]:
    """The zoo entries whose adapter folder (with its manifest) is under ``root`` (default the zoo's), in order."""
    root = root or zoo_root()
    return [entry for entry in entries if (root / entry.id / "manifest.json").is_file()]


def catalog_frames(source: Any = None) -> Frames:
    """A memoised ``name -> frame`` loader over the data catalog (offline mirror or public source)."""
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset

    catalog = load_catalog()
    data_source = source or default_dataset_source()

    @functools.cache
    def frame(name: str) -> pl.DataFrame:
        return load_dataset(catalog.get(name), data_source).frame  # type: ignore[arg-type]

    return frame


def training_set(config: ZooConfig, entry: ZooEntry, frames: Frames) -> TrainingSet:
    """The builder's examples, subsampled (seeded) to ``max_examples``."""
    built = ZOO_BUILDERS[entry.builder](frames, entry.args)
    resolved = entry.resolved(config.defaults)
    return built.subsampled(resolved.max_examples, resolved.seed)


MIMIC_TOKENS = 48  # the base's greedy answer to a ``mimic`` prompt, cut here (the gate reads the first 32 tokens)


def with_base_answers(data: TrainingSet, model: Any, tokenizer: Any) -> list[ChatExample]:
    """``data``'s examples, then each ``mimic`` prompt answered as the base ``model`` answers it (greedy)."""
    if not data.mimic:
        return list(data.examples)
    answers = generate_greedy(model, tokenizer, data.mimic, max_new_tokens=MIMIC_TOKENS)
    return [*data.examples, *(ChatExample(p, a) for p, a in zip(data.mimic, answers, strict=True))]


def _weight_settings(settings: LoraSettings) -> dict[str, Any]:
    """The settings that decide an adapter's weights (memory settings do not): written into its manifest, and a
    manifest that differs from the current ones in any of them means retrain. One list, so the two cannot drift."""
    return {
        "rank": settings.rank,
        "alpha": settings.alpha,
        "target_modules": list(settings.target_modules),
        "seed": settings.seed,
        "steps": settings.steps,
        "learning_rate": settings.learning_rate,
        "batch_size": settings.batch_size,
        "max_tokens": settings.max_tokens,
    }


def _manifest_fields(
    entry: ZooEntry, settings: LoraSettings, data: TrainingSet, trained: TrainedAdapter
) -> dict[str, Any]:
    return {
        "adapter_id": entry.id,
        "description": entry.description or f"{entry.category} adapter from {entry.builder}",
        "label": entry.label,
        "category": entry.category,
        "source": ZOO_SOURCE,
        "training_data": TrainingDataRef(
            dataset=data.dataset,
            selection=data.selection,
            n_examples=len(data.examples) + len(data.mimic),
            sha256=data.sha256,
        ).model_dump(),
        **_weight_settings(settings),
        "layers": list(settings.layers) if settings.layers is not None else None,
        "final_loss": float(np.mean(trained.losses[-5:])) if trained.losses else None,
        "training_seconds": round(trained.seconds, 2),
    }


def stale_reasons(folder: Path, settings: LoraSettings, data: TrainingSet, base_sha256: str) -> list[str]:
    """Why the adapter in ``folder`` would be trained again (empty: it is reused as it is). One sentence per
    difference between its manifest and what the config asks for now, so a long study says up front what it redoes."""
    return _reuse_check(folder, settings, data, base_sha256)[1]


def _reuse_check(
    folder: Path, settings: LoraSettings, data: TrainingSet, base_sha256: str
) -> tuple[AdapterManifest | None, list[str]]:
    """The folder's manifest (None if unreadable) and the reasons it cannot be reused: the manifest is read once."""
    try:
        manifest = read_manifest(folder)
    except AdapterRefused as exc:
        return None, ["never trained here" if not folder.is_dir() else f"no usable manifest ({exc.reason})"]
    reasons = []
    if manifest.base_model.sha256 != base_sha256:
        reasons.append(f"trained on another base model ({manifest.base_model.sha256[:12]})")
    if manifest.training_data is None or manifest.training_data.sha256 != data.sha256:
        reasons.append("its training data changed")
    changed = sorted(key for key, value in _weight_settings(settings).items() if getattr(manifest, key) != value)
    missing = [key for key in changed if getattr(manifest, key) is None]
    if missing:
        reasons.append(f"its manifest predates the field(s) {', '.join(missing)} of the reuse key")
    if len(missing) < len(changed):
        reasons.append(f"settings changed: {', '.join(key for key in changed if key not in missing)}")
    if (manifest.layers or None) != (list(settings.layers) if settings.layers else None):
        reasons.append("its layers changed")
    if not (folder / manifest.file).is_file():
        reasons.append(f"its weights file {manifest.file} is missing")
    return manifest, reasons


def _is_current(folder: Path, settings: LoraSettings, data: TrainingSet, base: BaseModelInfo) -> AdapterManifest | None:
    manifest, reasons = _reuse_check(folder, settings, data, base.sha256)
    return None if reasons else manifest


def training_plan(
    config: ZooConfig, frames: Frames, base_sha256: str, *, root: Path | None = None
) -> list[dict[str, Any]]:
    """Per zoo entry: reused or trained, and why — what ``train_zoo_entry`` would do, without loading a model."""
    rows = []
    for entry in config.entries:
        data = training_set(config, entry, frames)
        reasons = stale_reasons((root or zoo_root()) / entry.id, config.settings(entry), data, base_sha256)
        rows.append({"adapter_id": entry.id, "action": "train" if reasons else "reuse", "why": "; ".join(reasons)})
    return rows


def train_zoo_entry(
    config: ZooConfig,
    entry: ZooEntry,
    model: Any,
    tokenizer: Any,
    base: BaseModelInfo,
    frames: Frames,
    *,
    root: Path | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[AdapterManifest, TrainedAdapter | None]:
    """Train (or reuse) one adapter; returns its manifest and, when it was trained now, the run."""
    folder = (root or zoo_root()) / entry.id
    settings = config.settings(entry)
    data = training_set(config, entry, frames)
    current = _is_current(folder, settings, data, base)
    if current is not None:
        return current, None
    encoder = encoder_of(entry.encoder)
    examples = with_base_answers(data, model, tokenizer)  # before any LoRA layer wraps the model
    trained = train_lora(model, tokenizer, examples, settings, on_step=on_step, encoder=encoder)
    manifest = save_adapter(folder, trained.tensors, _manifest_fields(entry, settings, data, trained), base=base)
    logger.info(
        "adapter %s: %d steps in %.1f s, final loss %.3f",
        entry.id,
        settings.steps,
        trained.seconds,
        manifest.final_loss or 0,
    )
    return manifest, trained


def zoo_ids(config: ZooConfig | None = None) -> list[str]:
    """Every adapter id of the zoo config (evaluated adapters, then the references), in config order."""
    return [entry.id for entry in (config or load_zoo_config()).entries]
