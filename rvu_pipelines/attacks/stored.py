"""Optimised attack strings as committed files: the string, the weights it was optimised on, and how it was made.

A string optimised on one model's weights says nothing about another's, so loading one for a model whose sha256
differs is refused, never silently used. The file carries what a reader needs to judge it: the objective, the
pipeline its prompts were captured under, the training scenarios (held out from every evaluation), the steps,
the final loss and the CPU time it cost, the command, code version, date and machine.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from rvu_pipelines.atomic_write import atomic_path
from rvu_pipelines.errors import ConfigError


@dataclass(frozen=True)
class StoredString:
    name: str  # the attack it serves: "gcg_universal" or "adaptive-<defense>"
    profile: str
    model_sha256: str
    text: str
    token_ids: tuple[int, ...]
    objective: str  # what was minimised, in words
    defense: str  # the pipeline the prompts were captured under
    train_scenarios: tuple[str, ...]
    steps: int
    loss: float
    solved: bool
    cpu_minutes: float
    config: dict[str, Any] = field(default_factory=dict)
    code_version: str = ""
    created: str = ""
    machine: str = ""
    command: str = ""  # the command that made it (a resumed run: the command that finished it)


def string_path(strings_dir: Path, name: str, profile: str) -> Path:
    return Path(strings_dir) / f"{name}_{profile}.json"


def save_string(path: Path, stored: StoredString) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {**asdict(stored), "token_ids": list(stored.token_ids), "train_scenarios": list(stored.train_scenarios)}
    with atomic_path(path) as temp:
        Path(temp).write_text(json.dumps(document, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    return path


def load_string(path: Path, model_sha256: str) -> StoredString:
    """The stored string at ``path``, refused unless it was optimised on the weights ``model_sha256``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"No optimised attack string at {path}: make it with `python scripts/optimise_attack.py --name <name>` "
            "for this profile (`make attacks` only reads stored strings)."
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); regenerate it with scripts/optimise_attack.py.") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(raw).__name__}.")
    known = {f.name for f in fields(StoredString)}
    required = [f.name for f in fields(StoredString) if f.default is MISSING and f.default_factory is MISSING]
    missing = sorted(name for name in required if name not in raw)
    if missing:
        raise ConfigError(
            f"{path}: missing field(s) {', '.join(missing)}; regenerate it with scripts/optimise_attack.py."
        )
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}.")
    if not isinstance(raw["text"], str) or not raw["text"]:
        raise ConfigError(f"{path}: field 'text' must be a non-empty string.")
    stored = StoredString(
        **{
            **{f.name: raw[f.name] for f in fields(StoredString) if f.name in raw},
            "token_ids": tuple(int(t) for t in raw["token_ids"]),
            "train_scenarios": tuple(str(s) for s in raw.get("train_scenarios", ())),
        }
    )
    if stored.model_sha256 != model_sha256:
        raise ConfigError(
            f"{path}: the string was optimised on weights {stored.model_sha256[:12]}…, the running model is "
            f"{model_sha256[:12]}…; an optimised string does not carry over between weights. Re-optimise it for "
            "this model (scripts/optimise_attack.py) or run the profile it was made for."
        )
    return stored
