"""One call that runs the memory-poisoning study and writes its tables and plots (assets and the script
both call this, so the UI and ``make memory-poisoning`` produce the same files)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from rvu_pipelines.atomic_write import write_atomically, write_stream_atomically
from rvu_pipelines.machine import write_stamp
from rvu_pipelines.memory_poisoning.comparisons import comparisons_markdown, paired_comparisons
from rvu_pipelines.memory_poisoning.defenses.base import WriteDetector
from rvu_pipelines.memory_poisoning.defenses.benign_kappa import KappaChoice, kappa_on_benign
from rvu_pipelines.memory_poisoning.defenses.composite import composite_defense
from rvu_pipelines.memory_poisoning.defenses.memsad import MemsadDetector
from rvu_pipelines.memory_poisoning.report import (
    paper_comparison_markdown,
    plot_retro_scan,
    plot_roc_curves,
    plot_score_histograms,
    retrieval_markdown,
    retro_scan_markdown,
    write_time_markdown,
)
from rvu_pipelines.memory_poisoning.sir import SIRConfig, SIRCurves, plot_sir, simulate_sir
from rvu_pipelines.memory_poisoning.study import attack_defense_matrix, context_for, detector_suite, protocol_contrast
from rvu_pipelines.memory_poisoning.study_adaptive import AdaptiveResult, adaptive_study
from rvu_pipelines.memory_poisoning.study_cells import ATTACKS, AttackCell, EmbeddingCache, StudyConfig, build_cell
from rvu_pipelines.memory_poisoning.timeline import (
    GOAL_FPR,
    GOAL_TRIGGERED,
    ScanConfig,
    ScanRun,
    flag_curve,
    retro_scan_study,
    scan_incident,
)
from rvu_pipelines.models.embedding import Embedder
from rvu_pipelines.tracking import metric_name

if TYPE_CHECKING:
    from rvu_pipelines.memory_poisoning.defenses.hybrid import HybridDetector

Progress = Callable[[str], None]
HYBRID_FPR_TARGET = 0.01  # the hybrid's kappa: the smallest whose cross-validated benign FPR is at most this
SCAN_DETECTORS = ("memsad", "energy", "composite", "hybrid")  # the detectors whose score depends on the served queries


@dataclass
class StudyResult:
    """What one study run produced; ``files`` are the tables and plots it wrote (name -> path)."""

    config: StudyConfig
    matrix: pl.DataFrame
    protocol: dict[str, float]
    adaptive: list[AdaptiveResult] = field(default_factory=list)
    sir: list[SIRCurves] = field(default_factory=list)
    retro: pl.DataFrame = field(default_factory=pl.DataFrame)
    comparisons: pl.DataFrame = field(default_factory=pl.DataFrame)
    hybrid_kappa: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Flat numbers for MLflow: every matrix cell's AUROC / TPR / FPR / ASR-R, the adaptive and SIR results."""
        out: dict[str, float] = {f"protocol_{k}": float(v) for k, v in self.protocol.items()}
        for r in self.matrix.iter_rows(named=True):
            prefix = f"{r['attack']}_{r['defense']}_{r['calibration']}"
            for key in ("auroc", "tpr", "fpr", "asr_r_undefended", "asr_r_defended", "benign_accuracy"):
                out[f"{prefix}_{key}"] = float(r[key])
        for a in self.adaptive:
            for key, value in a.as_dict().items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    out[f"adaptive_{a.method}_{key}"] = float(value)
        for curves in self.sir:
            out.update({f"sir_{curves.defense}_{k}": v for k, v in curves.summary().items()})
        for r in self.retro.iter_rows(named=True):
            for key, value in r.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    out[f"retro_{r['attack']}_{r['defense']}_{key}"] = float(value)
        for r in self.comparisons.iter_rows(named=True):
            prefix = f"compare_{r['attack']}_{r['calibration']}_{r['a']}_vs_{r['b']}"
            out.update(
                {f"{prefix}_delta_auroc": float(r["difference"]), f"{prefix}_p_adjusted": float(r["p_adjusted"])}
            )
        if self.hybrid_kappa:
            out["hybrid_kappa"] = float(self.hybrid_kappa["kappa"])
            out["hybrid_kappa_cv_fpr"] = float(self.hybrid_kappa["cv_fpr"])
        out.update({f"seconds_{k}": v for k, v in self.timings.items()})
        return {metric_name(k): v for k, v in out.items()}

    def summary(self) -> dict[str, Any]:
        return {
            "config": _config_dict(self.config),
            "protocol": self.protocol,
            "matrix": self.matrix.to_dicts(),
            "adaptive": [a.as_dict() for a in self.adaptive],
            "sir": {c.defense: c.summary() for c in self.sir},
            "retro_scan": self.retro.to_dicts(),
            "comparisons": self.comparisons.to_dicts(),
            "hybrid_kappa": self.hybrid_kappa,
            "timings": self.timings,
            "files": {k: str(v) for k, v in self.files.items()},
        }


def _config_dict(config: StudyConfig) -> dict[str, Any]:
    out = asdict(config)
    out["minja_victims"] = list(config.minja_victims) if config.minja_victims else None
    out["adaptive_methods"] = list(config.adaptive_methods)
    return out


def hybrid_maker(llm_path: Path | None) -> Callable[[float], HybridDetector]:
    """The hybrid discrete check at a given kappa (``defenses/hybrid.py``: lexical coverage with WordNet
    synonyms, trigger tokens); with ``llm_path`` its perplexity feature runs on the local LLM."""
    from rvu_pipelines.memory_poisoning.defenses.hybrid import DEFAULT_FEATURES, HybridDetector

    scorer = None
    if llm_path is not None:
        from rvu_pipelines.memory_poisoning.defenses.perplexity import LlamaPerplexity

        scorer = LlamaPerplexity(llm_path)
    features = DEFAULT_FEATURES if scorer is not None else tuple(f for f in DEFAULT_FEATURES if f != "perplexity")
    return lambda kappa: HybridDetector(kappa, features=features, nll_scorer=scorer)


def hybrid_factory(llm_path: Path | None, kappa: float | None = None) -> Callable[[], WriteDetector]:
    """The hybrid at ``kappa`` (its module default when None), a fresh instance per call."""
    from rvu_pipelines.memory_poisoning.defenses.hybrid import HYBRID_KAPPA

    make = hybrid_maker(llm_path)
    chosen = HYBRID_KAPPA if kappa is None else kappa
    return lambda: make(chosen)


def benign_hybrid_kappa(cell: AttackCell, llm_path: Path | None, fpr_target: float = HYBRID_FPR_TARGET) -> KappaChoice:
    """The hybrid's kappa from the benign reference entries alone (5-fold, plain history): no attack data."""
    return kappa_on_benign(hybrid_maker(llm_path), context_for(cell, "plain"), fpr_target=fpr_target)


def run_study(
    frames: Mapping[str, pl.DataFrame],
    embedder: Embedder,
    config: StudyConfig,
    out_dir: Path,
    *,
    llm_path: Path | None = None,
    attacks: tuple[str, ...] = ATTACKS,
    adaptive: bool = True,
    sir: SIRConfig | None = SIRConfig(),
    scan: ScanConfig | None = ScanConfig(),
    progress: Progress | None = None,
) -> StudyResult:
    """Cells -> matrix (+ protocol contrast) -> adaptive attacks and hybrid -> SIR; tables and plots to ``out_dir``."""
    say = progress or (lambda _: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    embed = EmbeddingCache(embedder)
    timings: dict[str, float] = {}
    cells: list[AttackCell] = []
    for attack in attacks:
        start = time.perf_counter()
        cells.append(build_cell(attack, frames, embed, config))
        timings[f"attack_{attack}"] = time.perf_counter() - start
        victims = sum(len(m.victim_vectors) for m in cells[-1].members or (cells[-1],))
        say(f"{attack}: {len(cells[-1].attack.poisons)} poisons, {victims} victim queries (ASR-R)")
    start = time.perf_counter()
    kappa = benign_hybrid_kappa(cells[0], llm_path)
    say(f"hybrid: kappa {kappa.kappa:g} (5-fold benign FPR {kappa.cv_fpr:.3f}, target {kappa.fpr_target:g})")
    hybrid = hybrid_factory(llm_path, kappa.kappa)
    detectors = {**detector_suite(config.kappa), "hybrid": hybrid}
    matrix, raw = attack_defense_matrix(cells, detectors, top_k=config.top_k, progress=say)
    timings["matrix"] = time.perf_counter() - start
    ap = next((c for c in cells if c.name == "agentpoison"), None)
    protocol = protocol_contrast(ap, config.top_k) if ap is not None else {}
    result = StudyResult(config, matrix, protocol, timings=timings, hybrid_kappa=kappa.as_dict())
    start = time.perf_counter()
    result.comparisons = paired_comparisons(raw)
    timings["comparisons"] = time.perf_counter() - start
    runs: dict[tuple[str, str], list[ScanRun]] = {}
    if scan is not None:
        start = time.perf_counter()
        scanned = {name: detectors[name] for name in SCAN_DETECTORS}
        result.retro, runs = retro_scan_study(cells, scanned, replace(scan, top_k=config.top_k), progress=say)
        timings["retro_scan"] = time.perf_counter() - start
    if adaptive and ap is not None:
        start = time.perf_counter()
        result.adaptive = adaptive_study(
            ap,
            embedder,
            hybrid,
            kappa=config.kappa,
            top_k=config.top_k,
            max_poisons=config.adaptive_poisons,
            methods=config.adaptive_methods,
            progress=say,
        )
        timings["adaptive"] = time.perf_counter() - start
    if sir is not None and ap is not None:
        start = time.perf_counter()
        result.sir = sir_study(ap, embedder, config, sir, progress=say)
        timings["sir"] = time.perf_counter() - start
    result.files = write_outputs(result, raw, out_dir, runs)
    return result


def sir_study(
    cell: AttackCell, embedder: Embedder, config: StudyConfig, sir: SIRConfig, progress: Progress | None = None
) -> list[SIRCurves]:
    """The paper's SIR figure on the AgentPoison cell: no defense, MEMSAD (κ = 2.0), composite (κ = 1.0)."""
    context = context_for(cell, "triggered")
    defenses: dict[str, WriteDetector | None] = {
        "no defense": None,
        f"MEMSAD (k={config.kappa:g})": MemsadDetector(config.kappa).fit(context),
        "composite (k=1)": composite_defense(1.0).fit(context),
    }
    sir = replace(sir, top_k=config.top_k)
    return [
        simulate_sir(
            embedder,
            cell.memory,
            cell.attack.poisons,
            cell.victim_vectors,
            cell.benign_query_vectors,
            detector,
            defense=name,
            config=sir,
            progress=progress,
        )
        for name, detector in defenses.items()
    ]


def write_outputs(
    result: StudyResult,
    raw: Mapping[tuple[str, str, str], Any],
    out_dir: Path,
    runs: Mapping[tuple[str, str], list[ScanRun]] | None = None,
) -> dict[str, Path]:
    files = {
        "matrix_parquet": out_dir / "matrix.parquet",
        "paper_table_md": out_dir / "paper_table.md",
        "write_time_md": out_dir / "write_time.md",
        "retrieval_md": out_dir / "retrieval.md",
        "comparisons_md": out_dir / "comparisons.md",
        "comparisons_parquet": out_dir / "comparisons.parquet",
        "summary_json": out_dir / "summary.json",
    }
    write_stream_atomically(files["matrix_parquet"], result.matrix.write_parquet)
    write_atomically(files["paper_table_md"], paper_comparison_markdown(result.matrix) + "\n")
    write_atomically(files["write_time_md"], write_time_markdown(result.matrix) + "\n")
    write_atomically(files["retrieval_md"], retrieval_markdown(result.matrix) + "\n")
    write_stream_atomically(files["comparisons_parquet"], result.comparisons.write_parquet)
    write_atomically(files["comparisons_md"], comparisons_markdown(result.comparisons) + "\n")
    if runs:
        files["retro_scan_parquet"] = out_dir / "retro_scan.parquet"
        write_stream_atomically(files["retro_scan_parquet"], result.retro.write_parquet)
        files["retro_scan_md"] = out_dir / "retro_scan.md"
        write_atomically(files["retro_scan_md"], retro_scan_markdown(result.retro, GOAL_TRIGGERED, GOAL_FPR) + "\n")
        files["retro_scan_png"] = plot_retro_scan(
            {key: [flag_curve(r) for r in scans] for key, scans in runs.items()}, out_dir / "retro_scan.png"
        )
        first = runs.get(("agentpoison", "memsad"))
        incident = scan_incident(first[0], out_dir / "retro_scan_incident.jsonl") if first else None
        if incident is not None:
            files["retro_scan_incident"] = incident
    files["roc_png"] = plot_roc_curves(raw, out_dir / "roc.png")
    files["memsad_hist_png"] = plot_score_histograms(raw, out_dir / "memsad_scores.png")
    if result.sir:
        files["sir_png"] = Path(plot_sir(result.sir, str(out_dir / "sir.png")))
    write_atomically(files["summary_json"], json.dumps(result.summary(), indent=1, sort_keys=True, default=_json))
    files["stamp_json"] = write_stamp(out_dir)
    return files


def _json(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
