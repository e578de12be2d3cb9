"""Write HuggingFace `datasets` splits in the mirror's file layout, so one parser serves both paths."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from rvu_pipelines.data.specs import DatasetSpec
from rvu_pipelines.errors import DatasetUnavailableError

HfRows = dict[str, Iterable[dict]]


def _jsonl(path: Path, rows: Iterable[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # written in place: into the staging folder, published whole by one rename
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def _deepset(rows: HfRows, out: Path) -> None:
    """train rows first, then test, as in the mirror (rows 0-545 train, 546-661 test)."""
    _jsonl(
        out / "prompt_injections.jsonl",
        ({"text": r["text"], "label": int(r["label"])} for split in ("train", "test") for r in rows[split]),
    )


def _trustair(rows: HfRows, out: Path) -> None:
    keys = ("prompt", "jailbreak", "source", "platform", "date")
    _jsonl(out / "jailbreaks.jsonl", ({k: r.get(k) for k in keys} for r in rows["train"]))


def _wmdp(rows: HfRows, out: Path) -> None:
    records = [
        {"question": r["question"], "choices": list(r["choices"]), "answer": int(r["answer"])} for r in rows["test"]
    ]
    # written in place: into the staging folder, published whole by one rename
    (out / "cyber_questions.json").write_text(json.dumps(records), encoding="utf-8")


_EXPORTERS: dict[str, Callable[[HfRows, Path], None]] = {
    "deepset_prompt_injections": _deepset,
    "trustair_jailbreaks": _trustair,
    "wmdp_cyber": _wmdp,
}


def export_hf_dataset(spec: DatasetSpec, rows: HfRows, out: Path) -> None:
    exporter = _EXPORTERS.get(spec.name)
    if exporter is None:
        raise DatasetUnavailableError(
            f"Data set '{spec.name}' declares a HuggingFace source but no exporter knows its layout; "
            f"add one to {__name__}."
        )
    exporter(rows, out)
