"""D4: the offline encoder (all-MiniLM-L6-v2 from the model store) fine-tuned per training split.

Seed 002 §5.2 fine-tunes DeBERTa-v3 with its embeddings and lower encoder layers frozen, training
the top layers and the head (12.1% of parameters), AdamW, lr 2e-5, weight decay 0.01, batch 8,
clipping 1.0, seed 42, 3 / 3 / 2 epochs. Here the embeddings and the lower 3 of MiniLM's 6 layers
stay frozen; the top 3 layers and a head on the mean-pooled tokens (sentence-transformers' pooling
for this model) train, with the paper's batch size, weight decay, clipping, seed and epochs. Two
settings differ, because the paper started from a checkpoint that already was an injection
classifier and MiniLM does not: the fresh head gets its own learning rate (1e-3) and the encoder
layers 1e-4. These and the number of trainable layers were chosen on a validation split carved
from deepset's *training* split (stratified 20%, seed 42), never on a test split
(``scripts/select_d4_settings.py``; the first two rows without length-grouped batching):

| head lr | encoder lr | trainable layers | epochs | val F1 | val AUROC |
|---|---|---|---|---|---|
| 2e-5 | 2e-5 | 2 | 3 | 70.8 | 92.9 |
| 1e-3 | 2e-5 | 2 | 3 | 83.8 | 94.9 |
| 1e-3 | 2e-5 | 3 | 3 | 86.1 | 95.9 |
| 1e-3 | 1e-4 | 2 | 3 | 89.7 | 97.7 |
| 1e-3 | 1e-4 | 2 | 5 | 91.1 | 98.0 |
| 1e-3 | 1e-4 | 3 | 3 | **93.7** | **98.7** |

The frozen part is a fixed feature extractor (eval mode), so its output is computed once per text
and each epoch runs only the trainable layers, on length-grouped batches. Only what training changed
is saved (top layers + head, safetensors) with the sha256 of the base encoder; loading re-resolves
the base encoder and refuses one with a different digest.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import MutableMapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import numpy as np

from rvu_pipelines.atomic_write import atomic_path, write_atomically
from rvu_pipelines.detectors.base import DetectorBase, Span, tokenizer_window_spans
from rvu_pipelines.detectors.registry_formats import (
    KIND_KEY,
    NAME_KEY,
    RegistryFormat,
    pinned_requirements,
    register_format,
)
from rvu_pipelines.errors import ChecksumMismatchError, DetectorError

FORMAT = "rvu-d4-finetuned/1"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "detector.json"
ENCODER_ROLE: Final = "embedder"  # Final: typed as the Literal model role
SEED_EPOCHS = {"deepset": 3, "jailbreak": 3, "combined": 2, "jackhhao": 3}


@dataclass(frozen=True)
class FinetuneSettings:
    """Seed 002 §11.3 hyperparameters, adapted to a 6-layer encoder with a fresh head (see the module doc).

    ``max_length`` is the model's window in tokens ([CLS] and [SEP] included): longer texts are scored
    window by window (see :class:`FinetunedDetector`). ``logit_offset`` is a calibration, not a training
    setting: it is subtracted from the injection logit margin ``logit1 - logit0`` before the sigmoid, so
    that score 0.5 is the calibrated operating threshold; 0 for an uncalibrated model (scores are then
    the softmax of the two logits).
    """

    epochs: int = 3
    batch_size: int = 8
    learning_rate: float = 1e-4
    head_learning_rate: float = 1e-3
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    max_length: int = 128
    trainable_layers: int = 3
    dropout: float = 0.1
    group_by_length: bool = True
    seed: int = 42
    logit_offset: float = 0.0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.max_length < 8 or self.trainable_layers < 0:
            raise DetectorError(
                f"Invalid fine-tuning settings {self}: epochs, batch_size >= 1, max_length >= 8, trainable_layers >= 0."
            )
        if not math.isfinite(self.logit_offset):
            raise DetectorError(f"Invalid logit_offset {self.logit_offset}: a finite number (0 when uncalibrated).")

    def params(self) -> dict[str, object]:
        return {f"d4_{k}": v for k, v in asdict(self).items()}


def settings_for(corpus: str, **overrides: Any) -> FinetuneSettings:
    """The paper's epochs for that corpus (3, or 2 for the combined corpus), plus any overrides."""
    return replace(FinetuneSettings(epochs=SEED_EPOCHS.get(corpus, 3)), **overrides)


@dataclass(frozen=True)
class EncoderRef:
    """The base encoder a D4 model was trained from: where it is and the digest it must have."""

    name: str
    path: Path
    sha256: str

    def record(self) -> dict[str, str]:
        return {"name": self.name, "sha256": self.sha256}


def resolve_encoder(profile: str | None = None) -> EncoderRef:
    """The profile's embedder (all-MiniLM-L6-v2, package-shipped by default), sha256-verified."""
    from rvu_pipelines.models import ModelStore, load_model_config

    resolved = ModelStore().resolve(ENCODER_ROLE, load_model_config().profile(profile)[ENCODER_ROLE])
    return EncoderRef(resolved.name, resolved.path, resolved.sha256)


def base_encoder_for(recorded: dict[str, str], encoder: EncoderRef | None = None) -> EncoderRef:
    """The encoder a saved D4 (weights or exported graphs) was trained on: ``encoder`` or the profile's, refused
    unless its sha256 is the recorded one (the tokenizer and the frozen layers come from it)."""
    base = encoder or resolve_encoder()
    if base.sha256 != recorded["sha256"]:
        raise ChecksumMismatchError(
            f"D4 base encoder ({recorded['name']})",
            str(base.path),
            recorded["sha256"],
            base.sha256,
            fix="Point the embedder role at the encoder this detector was trained on.",
        )
    return base


def _build_model(encoder: EncoderRef, settings: FinetuneSettings) -> Any:
    import torch
    from torch import nn
    from transformers import AutoModel
    from transformers.masking_utils import create_bidirectional_mask

    class EncoderClassifier(nn.Module):
        """Frozen lower part -> trainable top layers -> masked mean pooling -> dropout -> linear head.

        ``lower`` and ``upper`` split the encoder where the frozen part ends, so training can run
        the frozen part once per text and only the top layers each epoch; ``forward`` composes them
        and is what inference runs (the attention mask is built by transformers' own helper).
        """

        def __init__(self) -> None:
            super().__init__()
            self.encoder = AutoModel.from_pretrained(str(encoder.path), add_pooling_layer=False)
            self.split = len(self.encoder.encoder.layer) - settings.trainable_layers
            self.dropout = nn.Dropout(settings.dropout)
            self.head = nn.Linear(self.encoder.config.hidden_size, 2)

        def _mask(self, hidden: Any, attention_mask: Any) -> Any:
            return create_bidirectional_mask(
                config=self.encoder.config, inputs_embeds=hidden, attention_mask=attention_mask
            )

        def lower(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = self.encoder.embeddings(input_ids=input_ids)
            mask = self._mask(hidden, attention_mask)
            for layer in self.encoder.encoder.layer[: self.split]:
                hidden = layer(hidden, mask)
            return hidden

        def upper(self, hidden: Any, attention_mask: Any) -> Any:
            mask = self._mask(hidden, attention_mask)
            for layer in self.encoder.encoder.layer[self.split :]:
                hidden = layer(hidden, mask)
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
            return self.head(self.dropout(pooled))

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.upper(self.lower(input_ids, attention_mask), attention_mask)

    torch.manual_seed(settings.seed)  # the head's initial weights
    model = EncoderClassifier()
    if settings.trainable_layers > len(model.encoder.encoder.layer):
        raise DetectorError(
            f"trainable_layers={settings.trainable_layers} but the encoder has "
            f"{len(model.encoder.encoder.layer)} layers."
        )
    for parameter in model.encoder.parameters():
        parameter.requires_grad = False
    for layer in model.encoder.encoder.layer[model.split :]:
        for parameter in layer.parameters():
            parameter.requires_grad = True
    return model


def encoder_tokenizer(encoder: EncoderRef) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(encoder.path))


@dataclass(frozen=True)
class FinetuneReport:
    """What one fine-tuning run did and how long it took (logged to MLflow and the tables)."""

    wall_seconds: float
    n_train: int
    epochs: int
    steps: int
    trainable_params: int
    total_params: int
    epoch_losses: tuple[float, ...]
    settings: FinetuneSettings = field(default_factory=FinetuneSettings)

    @property
    def trainable_fraction(self) -> float:
        return self.trainable_params / self.total_params

    def metrics(self) -> dict[str, float]:
        out = {
            "finetune_wall_s": self.wall_seconds,
            "trainable_params": float(self.trainable_params),
            "total_params": float(self.total_params),
            "trainable_fraction": self.trainable_fraction,
            "train_steps": float(self.steps),
            "n_train": float(self.n_train),
        }
        out.update({f"train_loss_epoch_{i + 1}": loss for i, loss in enumerate(self.epoch_losses)})
        return out


class FinetunedDetector(DetectorBase):
    """D4: P(injection) from the fine-tuned encoder, ``sigmoid(logit1 - logit0 - settings.logit_offset)``.

    A text longer than the model's window (``settings.max_length`` tokens with [CLS]/[SEP]) is scored in
    windows of ``max_length - 2`` tokens, half a window apart, each the original substring at word
    boundaries; its score is the aggregate of its windows' scores, max by default (see
    :class:`DetectorBase`). Windows are scored in length-sorted batches so padding stays small (order of
    the output = order of the input)."""

    name = "D4 MiniLM fine-tuned"

    def __init__(
        self, model: Any, tokenizer: Any, settings: FinetuneSettings, encoder: EncoderRef, *, batch_size: int = 16
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.settings = settings
        self.encoder = encoder
        self.batch_size = batch_size

    def _window_spans(self, text: str) -> list[Span]:
        return tokenizer_window_spans(self.tokenizer, text, self.settings.max_length)

    def _score(self, texts: list[str]) -> np.ndarray:
        import torch

        encoded = self.tokenizer(texts, truncation=True, max_length=self.settings.max_length)["input_ids"]
        order = np.argsort([len(ids) for ids in encoded], kind="stable")
        out = np.empty(len(texts), dtype=np.float64)
        offset = self.settings.logit_offset
        self.model.eval()
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                batch = self.tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, return_tensors="pt")
                logits = self.model(batch["input_ids"], batch["attention_mask"]).float()
                if offset == 0.0:
                    out[rows] = torch.softmax(logits, dim=-1)[:, 1].numpy()
                else:
                    out[rows] = offset_probability(logits.numpy(), offset)
        return out

    def with_logit_offset(self, offset: float) -> FinetunedDetector:
        """A copy sharing the model whose scores are ``sigmoid(logit1 - logit0 - offset)``."""
        import copy

        clone = copy.copy(self)
        clone.settings = replace(self.settings, logit_offset=float(offset))
        return clone

    def quantized(self) -> FinetunedDetector:
        """A copy with int8 dynamic quantization of every Linear layer, for CPU latency only: scores move
        (activation ranges are taken per batch, so they also depend on batch composition), which is why
        the evaluation tables and the registry use the float model."""
        import copy
        import warnings

        import torch

        with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao (not a dependency)
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(
                copy.deepcopy(self.model), {torch.nn.Linear}, dtype=torch.qint8
            )
        clone = FinetunedDetector(model, self.tokenizer, self.settings, self.encoder, batch_size=self.batch_size)
        clone.name = f"{self.name} (int8)"
        return clone

    def trainable_state(self) -> dict[str, Any]:
        return {
            k: v.detach().contiguous() for k, v in self.model.state_dict().items() if k in _trainable_keys(self.model)
        }

    def save(self, folder: Path) -> Path:
        """``model.safetensors`` (the trained tensors) + ``detector.json`` (settings, base encoder digest)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = self.trainable_state()
        with atomic_path(folder / WEIGHTS_FILE) as weights:
            save_file(state, str(weights), metadata={"format": FORMAT})
        record = {
            "format": FORMAT,
            "name": self.name,
            "settings": asdict(self.settings),
            "encoder": self.encoder.record(),
            "tensors": sorted(state),
        }
        write_atomically(folder / CONFIG_FILE, json.dumps(record, indent=1, sort_keys=True))
        return folder

    @classmethod
    def load(cls, folder: Path, encoder: EncoderRef | None = None) -> FinetunedDetector:
        """Rebuild from :meth:`save`'s files on the base encoder (the profile's, unless given)."""
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
            raise DetectorError(f"{folder} holds no saved D4 detector ({CONFIG_FILE} + {WEIGHTS_FILE}).")
        record = json.loads((folder / CONFIG_FILE).read_text())
        if record.get("format") != FORMAT:
            raise DetectorError(f"{folder / CONFIG_FILE}: format {record.get('format')!r}, expected {FORMAT!r}.")
        base = base_encoder_for(record["encoder"], encoder)
        settings = FinetuneSettings(**record["settings"])
        model = _build_model(base, settings)
        state = load_file(str(folder / WEIGHTS_FILE))
        expected = _trainable_keys(model)
        if set(state) != expected:
            raise DetectorError(
                f"{folder / WEIGHTS_FILE} has tensors {sorted(set(state) ^ expected)[:5]} that do "
                "not match the D4 architecture; refused."
            )
        model.load_state_dict(state, strict=False)
        return cls(model, encoder_tokenizer(base), settings, base)


def offset_probability(logits: np.ndarray, offset: float) -> np.ndarray:
    """``sigmoid(logit1 - logit0 - offset)`` of two-class logits, in float64 (softmax[:, 1] at offset 0)."""
    from scipy.special import expit

    margin = np.asarray(logits, dtype=np.float64)
    return np.asarray(expit(margin[:, 1] - margin[:, 0] - float(offset)), dtype=np.float64)


def _trainable_keys(model: Any) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


def count_parameters(model: Any) -> tuple[int, int]:
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def _frozen_features(model: Any, tokenizer: Any, encoded: list[list[int]], batch_size: int = 32) -> list[Any]:
    """The frozen part's output for each text (trimmed to its length), computed once in eval mode."""
    import torch

    order = np.argsort([len(ids) for ids in encoded], kind="stable")
    features: list[Any] = [None] * len(encoded)
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, return_tensors="pt")
            hidden = model.lower(batch["input_ids"], batch["attention_mask"])
            for j, i in enumerate(rows):
                features[i] = hidden[j, : len(encoded[i])].clone()
    return features


def _pad_features(rows: list[Any]) -> tuple[Any, Any]:
    import torch

    width = max(row.shape[0] for row in rows)
    hidden = torch.zeros((len(rows), width, rows[0].shape[1]), dtype=rows[0].dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        hidden[i, : row.shape[0]] = row
        mask[i, : row.shape[0]] = 1
    return hidden, mask


def _batches(lengths: Sequence[int], batch_size: int, generator: Any, group_by_length: bool) -> list[list[int]]:
    """One epoch's batches. Grouped by length (as transformers' LengthGroupedSampler): shuffle, sort
    each window of 50 batches by length, cut, shuffle the batches; padding shrinks, order stays random."""
    import torch

    order = torch.randperm(len(lengths), generator=generator).tolist()
    if not group_by_length:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    window = batch_size * 50
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: -lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def finetune(
    texts: Sequence[str],
    labels: Sequence[int] | np.ndarray,
    *,
    encoder: EncoderRef | None = None,
    settings: FinetuneSettings | None = None,
    progress: bool = True,
    feature_cache: MutableMapping[str, Any] | None = None,
) -> tuple[FinetunedDetector, FinetuneReport]:
    """Fine-tune D4 on one training split; deterministic for a given seed, data and thread count.

    The frozen lower layers are a fixed feature extractor (eval mode, no dropout), so their output
    is computed once per text and each epoch runs only the trainable top layers and the head.
    ``feature_cache`` (text -> that output) carries it across calls that share the encoder, the number of
    trainable layers and ``max_length`` (e.g. the folds of a leave-one-source-out selection); the caller keys
    one cache per such setting.
    """
    import torch
    from tqdm.auto import tqdm

    settings = settings or FinetuneSettings()
    y = np.asarray(labels, dtype=np.int64)
    if len(texts) != len(y) or len(y) == 0 or not set(np.unique(y).tolist()) <= {0, 1}:
        raise DetectorError(
            f"D4 needs one 0/1 label per text; got {len(texts)} texts and labels {sorted(set(y.tolist()))}."
        )
    start = time.perf_counter()
    base = encoder or resolve_encoder()
    tokenizer = encoder_tokenizer(base)
    model = _build_model(base, settings)
    encoded = tokenizer(list(texts), truncation=True, max_length=settings.max_length)["input_ids"]
    if feature_cache is None:
        features = _frozen_features(model, tokenizer, encoded)
    else:
        missing = [i for i, text in enumerate(texts) if text not in feature_cache]
        computed = _frozen_features(model, tokenizer, [encoded[i] for i in missing]) if missing else []
        feature_cache.update({texts[i]: row for i, row in zip(missing, computed, strict=True)})
        features = [feature_cache[text] for text in texts]
    head = [p for n, p in model.named_parameters() if p.requires_grad and n.startswith("head.")]
    body = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head.")]
    optimizer = torch.optim.AdamW(
        [{"params": body, "lr": settings.learning_rate}, {"params": head, "lr": settings.head_learning_rate}],
        weight_decay=settings.weight_decay,
    )
    steps_per_epoch = (len(y) + settings.batch_size - 1) // settings.batch_size
    total_steps = steps_per_epoch * settings.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / total_steps))
    generator = torch.Generator().manual_seed(settings.seed)
    torch.manual_seed(settings.seed)  # dropout
    loss_fn = torch.nn.CrossEntropyLoss()
    trainable = [p for p in model.parameters() if p.requires_grad]
    epoch_losses = []
    bar = tqdm(total=total_steps, desc=f"D4 fine-tune ({len(y)} texts)", disable=not progress, leave=False)
    model.train()
    lengths = [len(ids) for ids in encoded]
    for _epoch in range(settings.epochs):
        running = 0.0
        for rows in _batches(lengths, settings.batch_size, generator, settings.group_by_length):
            hidden, mask = _pad_features([features[i] for i in rows])
            loss = loss_fn(model.upper(hidden, mask), torch.as_tensor(y[rows]))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, settings.max_grad_norm)
            optimizer.step()
            scheduler.step()
            running += float(loss.detach()) * len(rows)
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
        epoch_losses.append(running / len(y))
    bar.close()
    model.eval()
    trainable_count, total_count = count_parameters(model)
    report = FinetuneReport(
        time.perf_counter() - start,
        len(y),
        settings.epochs,
        total_steps,
        trainable_count,
        total_count,
        tuple(epoch_losses),
        settings,
    )
    return FinetunedDetector(model, tokenizer, settings, base), report


def untrained_detector(
    encoder: EncoderRef | None = None, settings: FinetuneSettings | None = None
) -> FinetunedDetector:
    """The D4 architecture with a fresh head: for latency benchmarks (latency does not depend on weights)."""
    base = encoder or resolve_encoder()
    settings = settings or FinetuneSettings()
    return FinetunedDetector(_build_model(base, settings), encoder_tokenizer(base), settings, base)


def _save_registered(detector: FinetunedDetector, folder: Path) -> None:
    """D4 as an MLflow pyfunc model from code (``mlflow_d4_model.py``) over its safetensors weights, so MLflow
    never cloudpickles a Python object."""
    import mlflow.pyfunc

    weights = detector.save(folder.parent / "d4_weights")
    mlflow.pyfunc.save_model(
        str(folder),
        python_model=str(Path(__file__).with_name("mlflow_d4_model.py")),
        artifacts={"detector": str(weights)},
        pip_requirements=pinned_requirements("torch", "transformers", "safetensors", "mlflow"),
        metadata={KIND_KEY: D4_FORMAT_TAG, NAME_KEY: detector.name, "encoder": detector.encoder.record()},
    )


def _load_registered(folder: Path, mlmodel: dict) -> FinetunedDetector:
    artifacts = mlmodel.get("flavors", {}).get("python_function", {}).get("artifacts", {})
    weights = (artifacts.get("detector") or {}).get("path", "artifacts/d4_weights")
    return FinetunedDetector.load(folder / weights)


D4_FORMAT_TAG = "d4-finetuned-safetensors"
register_format(RegistryFormat("d4", D4_FORMAT_TAG, FinetunedDetector, _save_registered, _load_registered))
