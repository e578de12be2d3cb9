"""The agent's GGUF weights in transformers: de-quantised to float32 once, kept as safetensors, loaded fresh.

transformers reads the packaged GGUF with ``from_pretrained(folder, gguf_file=name)`` and de-quantises it
(tens of seconds of CPU). The result is kept, never as a pickle, in ``<RVU_SPECTRAL_CACHE>/<sha256 of the GGUF>/``
(content-addressed, so every process, test session and clean clone reuses it). The spectral switch reads
attention from it; the adapter study trains LoRA adapters on it and scores probes with it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from rvu_pipelines.paths import spectral_cache_dir

logger = logging.getLogger(__name__)

_CONVERT_LOCK = threading.Lock()


def converted_folder(sha256: str) -> Path:
    return spectral_cache_dir() / sha256


def _save_converted(model: Any, tokenizer: Any, folder: Path) -> None:
    """float32 weights as safetensors (shared tensors handled), the config without its GGUF marker.

    Written into a private folder and renamed into place in one step, so another process (a parallel test
    worker, Dagster's multiprocess executor) never loads a half-written copy; the first to finish wins."""
    from safetensors.torch import save_model

    staging = folder.with_name(f".{folder.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        # written in place: the staging folder, published whole by one rename
        (staging / "config.json").write_text(json.dumps(config), encoding="utf-8")
        tokenizer.save_pretrained(staging)
        save_model(model, str(staging / "model.safetensors"))
        try:
            staging.rename(folder)  # refused when the folder exists and is not empty
        except OSError:
            if _is_converted(folder):
                return  # another process finished first
            stale = folder.with_name(f".{folder.name}.{os.getpid()}.stale")
            folder.rename(stale)  # a partial folder a crashed writer left: set aside in one step, then replace
            shutil.rmtree(stale, ignore_errors=True)
            staging.rename(folder)
    except OSError as exc:  # a read-only state folder (or a lost race) only costs the next load its time
        logger.warning("Could not cache the converted weights in %s: %s", folder, exc)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _load_converted(folder: Path, attn_implementation: str) -> tuple[Any, Any]:
    """from_pretrained on the folder: many times faster than from_config + load_model (from_config initialises
    every weight at random before the file overwrites it); same tensors, tied embeddings kept."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=attn_implementation, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(folder)


def _is_converted(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()


def load_dequantized(gguf_path: str | Path, *, sha256: str = "", attn_implementation: str = "eager") -> tuple[Any, Any]:
    """A fresh (model, tokenizer) pair of the GGUF's weights in float32 on CPU, in eval mode.

    Every call builds a new model, so a caller may wrap it (peft) or change it without touching anyone
    else's copy; with ``sha256`` the converted safetensors make that a sub-second load."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(gguf_path)
    if not path.is_file():
        raise FileNotFoundError(f"No GGUF file at {path}.")
    cached = converted_folder(sha256) if sha256 else None
    with _CONVERT_LOCK:
        if cached is not None and _is_converted(cached):
            model, tokenizer = _load_converted(cached, attn_implementation)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, attn_implementation=attn_implementation, dtype=torch.float32
            )
            if cached is not None:
                _save_converted(model, tokenizer, cached)
    model.eval()
    return model, tokenizer
