"""PyTorch → llama.cpp transfer of a universal string on the held-out scenarios it is evaluated on.

A universal string is optimised on training prompts of the de-quantised PyTorch copy of the agent's GGUF; its row
of the attack table is measured by the agent on llama.cpp with the quantised GGUF. To say how much of the white-box
result carries over to the runtime users run, each held-out scenario of the table's sample is checked on PyTorch (is
the attacker's call the greedy reply with the string planted?), stored under ``<RVU_HOME>/attacks/transfer/``, and
the attack study crosses it with the episodes. The check reads the prompt the string meets, captured through the
undefended agent's pipeline; it never sees an episode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from rvu_pipelines.atomic_write import atomic_path
from rvu_pipelines.attacks.gcg import target_outcome
from rvu_pipelines.attacks.optimised import (
    UNIVERSAL,
    UNIVERSAL_CALL,
    UNIVERSAL_CALL_MIXED,
    UNIVERSAL_CALL_STAGED,
    plant_of,
    slot_scenario,
)
from rvu_pipelines.attacks.stored import StoredString
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.contract import Scenario

# universal strings planted in the undefended agent's prompt
TRANSFER_STRINGS = (UNIVERSAL, UNIVERSAL_CALL, UNIVERSAL_CALL_MIXED, UNIVERSAL_CALL_STAGED)


@dataclass(frozen=True)
class PytorchOutcome:
    """One held-out scenario under the string on PyTorch: the target's cross-entropy and whether it is greedy."""

    scenario_id: str
    loss: float
    solved: bool  # the attacker's call is the greedy reply (the word the per-scenario strings' transfer uses)


def transfer_path(folder: Path, name: str, profile: str) -> Path:
    return Path(folder) / f"{name}_{profile}.json"


def _identity(stored: StoredString) -> dict[str, str]:
    """What the outcomes were computed for: the string, its weights and, for a string planted after the goal, how
    the goal is written out."""
    return {
        "name": stored.name,
        "model_sha256": stored.model_sha256,
        "text": stored.text,
        "plant": plant_of(stored.name),
    }


def pytorch_outcomes(
    stored: StoredString,
    scenarios: Sequence[Scenario],
    model: Any,
    tokenizer: Any,
    settings: Any,
    *,
    progress: bool = True,
) -> list[PytorchOutcome]:
    """Each scenario's outcome under ``stored`` on the PyTorch copy (scenarios whose injection the agent never reads
    are left out); a scenario the string was trained on is refused."""
    from rvu_pipelines.redteam.decision_point import capture

    if stored.name not in TRANSFER_STRINGS:
        raise ConfigError(f"Transfer is checked for the universal strings {', '.join(TRANSFER_STRINGS)}.")
    trained = set(stored.train_scenarios)
    out = []
    for scenario in tqdm(scenarios, desc=f"{stored.name} on PyTorch", unit="scenario", disable=not progress):
        if scenario.scenario_id in trained:
            raise ConfigError(f"{scenario.scenario_id} trained {stored.name}; check transfer on held-out scenarios.")
        caught = capture(slot_scenario(stored.name, scenario), tokenizer, settings)
        if caught is None:
            continue
        loss, greedy = target_outcome(model, caught.slot, stored.token_ids)
        out.append(PytorchOutcome(scenario.scenario_id, round(loss, 6), greedy))
    return out


def save_outcomes(path: Path, stored: StoredString, outcomes: Iterable[PytorchOutcome]) -> Path:
    """Add ``outcomes`` to the file at ``path`` (kept only while it is for the same string, weights and plant)."""
    known = load_outcomes(path, stored) or {}
    known.update({o.scenario_id: o for o in outcomes})
    document = {
        **_identity(stored),
        "profile": stored.profile,
        "scenarios": {sid: {"loss": o.loss, "solved": o.solved} for sid, o in sorted(known.items())},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temp:
        Path(temp).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return path


def load_outcomes(path: Path, stored: StoredString) -> dict[str, PytorchOutcome] | None:
    """The stored outcomes by scenario id; None when there are none for this very string, weights and plant."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if {key: document.get(key, "") for key in _identity(stored)} != _identity(stored):
            return None
        rows: Mapping[str, Mapping[str, Any]] = document["scenarios"]
        return {sid: PytorchOutcome(sid, float(r["loss"]), bool(r["solved"])) for sid, r in rows.items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path}: not a transfer file ({exc}); delete it and run scripts/universal_transfer.py."
        ) from exc
