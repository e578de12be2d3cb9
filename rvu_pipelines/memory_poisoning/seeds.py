"""The attack-defense matrix over several splits and seeds and both large memory regimes: mean ± sd.

One study run is one draw: one split of StrategyQA into memory / reference / benign writes / queries, one
trigger search, one MINJA and InjecMEM sampling. Seed ``s`` draws all of them afresh (``StudyConfig.seed``
sets the split and every attack's randomness), so the spread over seeds is the spread a reader should
expect from rerunning the study, which a single run's bootstrap interval does not show. Each seed is run at
|M| = 1,000 (``medium``) and at ``full`` (every record not held out), the matrix and its Bonferroni
comparisons each time; the summary gives per (regime, attack, history, detector) the mean and sample sd of
AUROC, TPR, FPR and ASR-R over seeds, with n per seed and the number of seeds, and per comparison in how
many seeds it is significant at α/m. The hybrid's κ is set on each split's benign entries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl

from rvu_pipelines.atomic_write import write_atomically, write_stream_atomically
from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.machine import write_stamp
from rvu_pipelines.memory_poisoning.comparisons import paired_comparisons
from rvu_pipelines.memory_poisoning.report import agg_pyplot
from rvu_pipelines.memory_poisoning.runner import benign_hybrid_kappa, hybrid_factory
from rvu_pipelines.memory_poisoning.study import attack_defense_matrix, detector_suite
from rvu_pipelines.memory_poisoning.study_cells import ATTACKS, EmbeddingCache, StudyConfig, build_cell
from rvu_pipelines.models.embedding import Embedder
from rvu_pipelines.tracking import metric_name

Progress = Callable[[str], None]
SWEEP_SEEDS = (0, 1, 2, 3, 4)
SWEEP_REGIMES = ("medium", "full")
SUMMARISED = ("auroc", "tpr", "fpr", "asr_r_undefended", "asr_r_defended", "benign_accuracy")
HEADLINE_HISTORIES = ("plain", "triggered_5pct", "triggered")  # seeds.md's columns; the parquet holds every history


@dataclass(frozen=True)
class SweepConfig:
    """Which draws to run: every regime x every seed, the rest of the study as ``base`` says."""

    seeds: tuple[int, ...] = SWEEP_SEEDS
    regimes: tuple[str, ...] = SWEEP_REGIMES
    base: StudyConfig = field(default_factory=lambda: StudyConfig(agentpoison_poisons=20, agentpoison_train=20))

    def __post_init__(self) -> None:
        if len(set(self.seeds)) < 2:
            raise MemoryPoisoningInputError(f"a spread over seeds needs at least two distinct seeds, got {self.seeds}")
        if not self.regimes:
            raise MemoryPoisoningInputError("name at least one memory regime")


@dataclass
class SweepResult:
    per_seed: pl.DataFrame  # the matrix rows of every draw, with regime and seed
    comparisons: pl.DataFrame  # the comparisons of every draw, with regime and seed
    summary: pl.DataFrame  # mean / sd over seeds per (regime, attack, defense, calibration)
    comparison_summary: pl.DataFrame  # per comparison: mean / sd of ΔAUROC, seeds significant
    timings: dict[str, float]
    files: dict[str, Path] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Mean and sd per summary row, and seeds significant per comparison, named for MLflow."""
        out: dict[str, float] = {}
        for r in self.summary.iter_rows(named=True):
            prefix = f"{r['regime']}_{r['attack']}_{r['defense']}_{r['calibration']}"
            for column in ("auroc", "tpr", "fpr"):
                for stat in ("mean", "sd"):
                    if r[f"{column}_{stat}"] is not None:
                        out[f"{prefix}_{column}_{stat}"] = float(r[f"{column}_{stat}"])
        for r in self.comparison_summary.iter_rows(named=True):
            prefix = f"compare_{r['regime']}_{r['attack']}_{r['calibration']}_{r['a']}_vs_{r['b']}"
            out[f"{prefix}_seeds_significant"] = float(r["seeds_significant"])
            out[f"{prefix}_delta_auroc_mean"] = float(r["difference_mean"])
        out.update({f"seconds_{k}": v for k, v in self.timings.items()})
        return {metric_name(k): v for k, v in out.items()}


def summarise_seeds(per_seed: pl.DataFrame) -> pl.DataFrame:
    """Mean and sample sd (ddof 1) over seeds of each summarised column; n per seed kept as min / max."""
    keys = ["regime", "attack", "defense", "calibration"]
    aggregations = [pl.col("seed").n_unique().alias("n_seeds")]
    for column in SUMMARISED:
        aggregations += [pl.col(column).mean().alias(f"{column}_mean"), pl.col(column).std().alias(f"{column}_sd")]
    for column in ("n_poisons", "n_benign", "n_benign_records"):
        aggregations += [pl.col(column).min().alias(f"{column}_min"), pl.col(column).max().alias(f"{column}_max")]
    return per_seed.group_by(keys).agg(aggregations).sort(keys)


def summarise_comparisons(comparisons: pl.DataFrame) -> pl.DataFrame:
    keys = ["regime", "attack", "calibration", "a", "b"]
    return (
        comparisons.group_by(keys)
        .agg(
            pl.col("seed").n_unique().alias("n_seeds"),
            pl.col("difference").mean().alias("difference_mean"),
            pl.col("difference").std().alias("difference_sd"),
            pl.col("significant").sum().alias("seeds_significant"),
            pl.col("m").max().alias("m"),
        )
        .sort(keys)
    )


def seed_sweep(
    frames: Mapping[str, pl.DataFrame],
    embedder: Embedder,
    config: SweepConfig,
    *,
    llm_path: Path | None = None,
    attacks: Sequence[str] = ATTACKS,
    progress: Progress | None = None,
    embed: EmbeddingCache | None = None,
) -> SweepResult:
    """Every (regime, seed): cells, the hybrid's κ on that split's benign entries, the matrix, the comparisons.
    ``embed``: a cache of ``embedder``'s to share with other work (what it already holds is not computed again)."""
    say = progress or (lambda _: None)
    if embed is not None and embed.embedder is not embedder:
        raise MemoryPoisoningInputError("seed_sweep: the embedding cache given belongs to another embedder")
    embed = embed or EmbeddingCache(embedder)  # texts recur across seeds and regimes: each is embedded once
    matrices, comparisons, timings = [], [], {}
    for regime in config.regimes:
        for seed in config.seeds:
            start = time.perf_counter()
            study = replace(config.base, regime=regime, seed=seed)
            cells = [build_cell(attack, frames, embed, study) for attack in attacks]
            kappa = benign_hybrid_kappa(cells[0], llm_path)
            detectors = {**detector_suite(study.kappa), "hybrid": hybrid_factory(llm_path, kappa.kappa)}
            matrix, raw = attack_defense_matrix(cells, detectors, top_k=study.top_k)
            draw = [pl.lit(regime).alias("regime"), pl.lit(seed).alias("seed")]
            matrices.append(matrix.with_columns(*draw, pl.lit(kappa.kappa).alias("hybrid_kappa")))
            comparisons.append(paired_comparisons(raw).with_columns(*draw))
            timings[f"{regime}_seed{seed}"] = time.perf_counter() - start
            say(f"{regime} seed {seed}: {matrix.height} matrix rows in {timings[f'{regime}_seed{seed}']:.0f} s")
    per_seed, compared = pl.concat(matrices, how="diagonal"), pl.concat(comparisons, how="diagonal")
    return SweepResult(per_seed, compared, summarise_seeds(per_seed), summarise_comparisons(compared), timings)


def _mean_sd(row: Mapping[str, object], column: str, digits: int) -> str:
    sd = row[f"{column}_sd"]
    spread = "—" if sd is None else f"{sd:.{digits}f}"
    return f"{row[f'{column}_mean']:.{digits}f} ± {spread}"


def seeds_markdown(summary: pl.DataFrame, histories: Sequence[str] = HEADLINE_HISTORIES) -> str:
    """Per regime and attack: AUROC and TPR / FPR mean ± sd over seeds for the headline histories."""
    if summary.is_empty():
        return "No draws."
    lines = []
    for regime in sorted(set(summary["regime"].to_list())):
        for attack in sorted(set(summary.filter(pl.col("regime") == regime)["attack"].to_list())):
            one = summary.filter((pl.col("regime") == regime) & (pl.col("attack") == attack))
            shown = [h for h in histories if h in set(one["calibration"].to_list())]
            first = one.row(0, named=True)
            n = (
                f"{first['n_seeds']} seeds; per seed {first['n_poisons_min']}-{first['n_poisons_max']} poisons, "
                f"{first['n_benign_min']}-{first['n_benign_max']} benign writes "
                f"({first['n_benign_records_min']}-{first['n_benign_records_max']} distinct records)"
            )
            lines += [
                f"**{regime} / {attack}** ({n}); cells: AUROC, TPR / FPR at threshold, mean ± sd over seeds",
                "",
                "| defense | " + " | ".join(shown) + " |",
                "|---" * (1 + len(shown)) + "|",
            ]
            for defense in sorted(set(one["defense"].to_list())):
                cells = []
                for h in shown:
                    r = one.filter((pl.col("defense") == defense) & (pl.col("calibration") == h)).row(0, named=True)
                    cells.append(f"{_mean_sd(r, 'auroc', 3)}, {_mean_sd(r, 'tpr', 2)} / {_mean_sd(r, 'fpr', 3)}")
                lines.append(f"| {defense} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines).rstrip()


def comparison_seeds_markdown(summary: pl.DataFrame) -> str:
    if summary.is_empty():
        return "No comparisons."
    lines = [
        "| regime | attack | history | reference vs | ΔAUROC mean ± sd | seeds significant at α/m | m |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in summary.iter_rows(named=True):
        sd = "—" if r["difference_sd"] is None else f"{r['difference_sd']:.3f}"
        lines.append(
            f"| {r['regime']} | {r['attack']} | {r['calibration']} | {r['a']} vs {r['b']} | "
            f"{r['difference_mean']:+.3f} ± {sd} | {r['seeds_significant']} / {r['n_seeds']} | {r['m']} |"
        )
    return "\n".join(lines)


def plot_seeds(summary: pl.DataFrame, path: Path, calibration: str = "plain") -> Path:
    """AUROC mean ± sd per detector, one panel per attack, regimes side by side (``calibration``'s history)."""
    plt = agg_pyplot()
    rows = summary.filter(pl.col("calibration") == calibration)
    attacks = sorted(set(rows["attack"].to_list()))
    regimes = sorted(set(rows["regime"].to_list()))
    fig, axes = plt.subplots(1, max(len(attacks), 1), figsize=(4.2 * max(len(attacks), 1), 4.0), squeeze=False)
    for ax, attack in zip(axes[0], attacks, strict=False):
        one = rows.filter(pl.col("attack") == attack)
        defenses = sorted(set(one["defense"].to_list()))
        width = 0.8 / len(regimes)
        for i, regime in enumerate(regimes):
            part = {r["defense"]: r for r in one.filter(pl.col("regime") == regime).iter_rows(named=True)}
            xs = [d + i * width for d in range(len(defenses))]
            means = [part[d]["auroc_mean"] if d in part else float("nan") for d in defenses]
            sds = [(part[d]["auroc_sd"] or 0.0) if d in part else 0.0 for d in defenses]
            ax.bar(xs, means, width, yerr=sds, capsize=2, label=regime)
        ax.axhline(0.5, color="grey", lw=0.5, ls="--")
        ax.set_xticks([d + 0.4 - width / 2 for d in range(len(defenses))], defenses, rotation=60, fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{attack} ({calibration} history)", fontsize=9)
        ax.set_ylabel("AUROC (mean ± sd over seeds)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    write_stream_atomically(path, lambda handle: fig.savefig(handle, format="png", dpi=110))
    plt.close(fig)
    return path


def write_sweep(result: SweepResult, out_dir: Path) -> dict[str, Path]:
    """seeds.parquet (every draw's rows), seeds.md, seeds_comparisons.md / .parquet, seeds.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "per_seed_parquet": out_dir / "seeds.parquet",
        "summary_parquet": out_dir / "seeds_summary.parquet",
        "seeds_md": out_dir / "seeds.md",
        "comparisons_parquet": out_dir / "seeds_comparisons.parquet",
        "comparisons_md": out_dir / "seeds_comparisons.md",
    }
    write_stream_atomically(files["per_seed_parquet"], result.per_seed.write_parquet)
    write_stream_atomically(files["summary_parquet"], result.summary.write_parquet)
    write_atomically(files["seeds_md"], seeds_markdown(result.summary) + "\n")
    write_stream_atomically(files["comparisons_parquet"], result.comparisons.write_parquet)
    write_atomically(files["comparisons_md"], comparison_seeds_markdown(result.comparison_summary) + "\n")
    files["seeds_png"] = plot_seeds(result.summary, out_dir / "seeds.png")
    files["stamp_json"] = write_stamp(out_dir)
    result.files = files
    return files
