"""Scoring an adapter on the gate's probe draw, public or private: the lab that reads the draw, the on-the-spot
scorer a load or a recovery uses, and the operator's screening of its known-good adapters on a private draw
(the table whose benign rows set the thresholds, ``probe_draw.screening_table_path``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import VerifiedAdapter
from rvu_pipelines.adapters.gate import GateConfig, load_gate_config
from rvu_pipelines.adapters.private_probes import PrivateDraw, private_lab
from rvu_pipelines.adapters.probe_draw import ProbeDraw
from rvu_pipelines.adapters.study import AdapterLab, LabScorer, score_adapters, scores_frame
from rvu_pipelines.adapters.zoo import zoo_root
from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.result_memo import ResultMemo


class LazyLabScorer:
    """A ``LabScorer`` whose lab (the de-quantised base, the probe prompts, the refusal reference) is loaded on
    the first adapter it must score, so a recovery or a check that never needs one pays nothing. With a private
    ``draw`` (``probe_draw.ProbeDraw``) the lab reads that draw's probes and items (``private_probes.private_lab``)."""

    def __init__(
        self,
        profile: str = "tiny",
        reference_id: str | None = None,
        draw: ProbeDraw | None = None,
        memo: ResultMemo | None = None,
    ) -> None:
        self.profile = profile
        self.reference_id = reference_id or load_gate_config().reference_adapter
        self.draw = draw or ProbeDraw()
        self.draw_id = self.draw.id  # ``admission.GateScorer``: the gate refuses a scorer of another draw
        # scores kept per adapter, lab and draw (``LabScorer``); the state folder's memo unless one is given
        self.memo = memo if memo is not None else ResultMemo.default()
        self._scorer: LabScorer | None = None

    def score(self, adapter: VerifiedAdapter) -> dict[str, float]:
        if self._scorer is None:
            # before the lab's minute of loading: without the reference no adapter can be scored
            reference_folder = zoo_root() / self.reference_id
            if not (reference_folder / "manifest.json").is_file():
                raise AdapterRefused(
                    "no_manifest",
                    f"No adapter folder at {reference_folder}: the gate's reference adapter (gate.reference_adapter "
                    f"'{self.reference_id}') is needed to score an adapter the screening table lacks; train it with "
                    f"`dg launch --job adapter_zoo_job --partition {self.reference_id} -m assets.definitions`.",
                )
            lab = AdapterLab.for_profile(self.profile)
            reference = lab.verify(self.reference_id)
            self._scorer = LabScorer(drawn_lab(lab, self.draw), reference, self.draw.id, self.memo)
        return self._scorer.score(adapter)


def drawn_lab(lab: AdapterLab, draw: ProbeDraw) -> AdapterLab:
    """``lab`` itself for the public draw, else a lab on the same base and adapters that reads the private draw."""
    if draw.seed is None:
        return lab
    return private_lab(lab, draw.seed)[0]


def draw_summary(draw: PrivateDraw, draw_id: str) -> dict[str, Any]:
    """What a private draw reads, as its screening table's ``draw.json`` keeps it: sizes and the fixed layers under
    the draw's id, never its seed."""
    return {"id": draw_id, **{k: v for k, v in asdict(draw).items() if k != "seed"}}


def screen_private_draw(
    lab: AdapterLab,
    draw: ProbeDraw,
    adapters: Sequence[VerifiedAdapter],
    reference: VerifiedAdapter,
    gate: GateConfig,
    table: Path,
    *,
    memo: ResultMemo | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Score ``adapters`` (the operator's known-good adapters, and any it has labelled harmful) on the private
    ``draw`` and write the draw's screening table at ``table`` with ``draw.json`` beside it; the load gate judges
    every later adapter against this table's benign rows. Returns the draw's summary with the table's counts."""
    if draw.seed is None:
        raise ValueError("The public draw's table is the adapter study's (make adapters); pass a private draw.")
    drawn, info = private_lab(lab, draw.seed)
    scores = score_adapters(drawn, adapters, reference, gate, memo=memo, progress=progress)
    table.parent.mkdir(parents=True, exist_ok=True)
    frame = scores_frame(scores)
    write_atomically(table, frame.write_csv())
    labels = frame["label"].to_list() if len(frame) else []
    summary = {
        **draw_summary(info, draw.id),
        "adapters": len(scores),
        "benign": sum(label == "benign" for label in labels),
        "harmful": sum(label == "harmful" for label in labels),
        "table": table.name,
    }
    write_atomically(table.parent / "draw.json", json.dumps(summary, indent=1, sort_keys=True))
    return summary
