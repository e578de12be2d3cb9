"""The adapter gate as the recovery pipeline asks for it: what each adapter of an incident was judged.

``ScreeningGate`` implements ``recovery.pipeline.AdapterGate``: for every adapter an incident loaded it
reports, in the certificate's ``adapter_attestation``, layer 1 on the log line itself (sha256 and source
against ``configs/adapters.yaml gate:`` plus the eviction blocklist) and layers 2-3 from an E4 screening
table (``scripts/adapter_study.py``'s scores.csv), looked up by the adapter's sha256. A behavioural
layer is judged against the ``1 - false_positive_budget`` quantile of the *benign* adapters' scores in that
table (the thresholds ``gate.evaluate_gate`` uses); an adapter absent from the table is "not screened",
never passed.

Evicted adapters reach layer 1 through ``adapters.blocklist``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rvu_pipelines.adapters.blocklist import read_blocklist
from rvu_pipelines.adapters.gate import GateConfig, list_verdict, load_gate_config
from rvu_pipelines.provenance.incident import IncidentRecord

BEHAVIOURAL_LAYERS = ("projection", "ood")


def benign_thresholds(scores: Iterable[Mapping[str, Any]], budget: float) -> dict[str, float]:
    """Per behavioural layer, the ``1 - budget`` quantile of the benign adapters' scores."""
    rows = [r for r in scores if r.get("label") == "benign"]
    if len(rows) < 2:
        return {}
    return {
        layer: float(np.quantile([float(r[layer]) for r in rows], 1.0 - budget, method="higher"))
        for layer in BEHAVIOURAL_LAYERS
    }


class ScreeningGate:
    """``recovery.pipeline.AdapterGate`` from the gate lists, the eviction blocklist and an E4 screening table."""

    name = "rvu-adapter-gate"

    def __init__(
        self,
        config: GateConfig | None = None,
        screened: Iterable[Mapping[str, Any]] = (),
        *,
        blocklist: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.config = config or load_gate_config()
        rows = [dict(r) for r in screened]
        self.screened = {str(r["sha256"]): r for r in rows}
        self.thresholds = benign_thresholds(rows, self.config.false_positive_budget)
        self.blocklist = dict(read_blocklist() if blocklist is None else blocklist)

    @classmethod
    def from_scores_csv(cls, path: Path, config: GateConfig | None = None) -> ScreeningGate:
        import polars as pl

        return cls(config, pl.read_csv(path).to_dicts() if path.is_file() else [])

    def screen(self, adapter: IncidentRecord) -> dict[str, Any]:
        sha, source = adapter.adapter_hash or "", adapter.source or "local"
        result: dict[str, Any] = {
            "sha256": sha,
            "source": source,
            "lists": list_verdict(sha, source, self.config, self.blocklist),
        }
        row = self.screened.get(sha)
        if row is None or not self.thresholds:
            result["behaviour"] = "not screened"
            result["verdict"] = "refuse" if result["lists"] != "pass" else "unknown"
            return result
        layers = {
            layer: {
                "score": round(float(row[layer]), 6),
                "threshold": round(self.thresholds[layer], 6),
                "rejects": float(row[layer]) > self.thresholds[layer],
            }
            for layer in BEHAVIOURAL_LAYERS
        }
        result["behaviour"] = layers
        rejected = result["lists"] != "pass" or any(v["rejects"] for v in layers.values())
        result["verdict"] = "refuse" if rejected else "pass"
        return result


def default_gate() -> ScreeningGate:
    """The gate ``rvu recover`` and the ``incident_recovery`` asset pass: configs/adapters.yaml's lists, the
    eviction blocklist and the adapter study's screening table (``<RVU_HOME>/adapter_study/scores.csv``,
    written by ``make adapters``) where it exists."""
    from rvu_pipelines.paths import state_dir

    return ScreeningGate.from_scores_csv(state_dir() / "adapter_study" / "scores.csv")
