"""Attack-table cells: (benchmark × attack × defense × model) run episode by episode, resumable, with CIs.

A cell's episodes are appended to its own parquet file as they finish, keyed by everything that
decides the outcome (scenario, defense, model sha256, defense settings, and for an attack other than the
benchmark's own what decides its text), and each row records the code
version that produced it. A stored row is reused only under the same key *and* the same code version:
so an interrupted cell resumes where it stopped, and a finished cell re-materializes by reading its
rows (no inference), but a row of other code is never passed off as this code's. ``rerun=True`` (the
nightly sweep, ``rvu regress``) re-runs every episode regardless. Below that, every LLM call goes
through the response cache, so a re-run or a changed setting only pays for the prompts that changed.

Latency: an episode's ``latency_s`` is its wall time plus the original inference time of the LLM
answers it took from the cache (``llm_replayed_s``; ``wall_latency_s`` keeps the measured time), so it
is the same whether or not another defense computed the same prompt first.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from rvu_pipelines.atomic_write import atomic_path, write_stream_atomically
from rvu_pipelines.code_version import code_version as current_code_version
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.axes import NATIVE
from rvu_pipelines.scenarios.contract import Scenario

CI_LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 2000
CI_SEED = 0


@dataclass(frozen=True)
class CellSpec:
    """Which cell: a benchmark (or the canonical 10) under one attack and one defense with one model profile."""

    benchmark: str
    defense: str
    profile: str
    limit: int | None = None  # scenarios per cell (fixed-seed sample); None = all
    attack: str = NATIVE  # how the benchmark's injections are rewritten (rvu_pipelines.attacks.catalog)

    @property
    def cell_id(self) -> str:
        return f"{self.profile}/{self.benchmark}/{self.attack}/{self.defense}"


@dataclass
class CellRun:
    """A cell's episode rows and what producing them cost."""

    spec: CellSpec
    rows: pl.DataFrame
    reused_episodes: int
    new_episodes: int
    llm_calls: int
    llm_cache_hits: int
    llm_inferences: int
    inference_seconds: float
    wall_seconds: float
    path: Path
    metrics: dict[str, float] = field(default_factory=dict)
    code_version: str = ""  # of every row (a reused row is reused only under the same version)
    replayed_seconds: float = 0.0  # original inference time of the answers the cache served
    rerun: bool = False  # every episode re-run against the current code (nightly sweep, rvu regress)

    def cost(self) -> dict[str, float]:
        """What the run cost; ``llm_inferences == 0`` is how a fully cached re-run shows itself."""
        return {
            "episodes_reused": self.reused_episodes,
            "episodes_run": self.new_episodes,
            "llm_calls": self.llm_calls,
            "llm_cache_hits": self.llm_cache_hits,
            "llm_inferences": self.llm_inferences,
            "inference_s": round(self.inference_seconds, 3),
            "llm_replayed_s": round(self.replayed_seconds, 3),
            "wall_s": round(self.wall_seconds, 3),
        }


def episode_key(
    scenario_id: str, defense: str, model_id: str, settings_fingerprint: str, attack_fingerprint: str = ""
) -> str:
    """Everything that decides an episode's outcome, hashed: a changed input never reuses a row.

    ``attack_fingerprint`` (``catalog.attack_fingerprint``) is "" for the benchmark's own injections and then
    leaves the payload as it is without an attack, so the native keys are the benchmark's own; any other
    attack's fingerprint is appended, so its episodes never share a key with native ones."""
    fields = [scenario_id, defense, model_id, settings_fingerprint]
    if attack_fingerprint:
        fields.append(attack_fingerprint)
    payload = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def cell_path(root: Path, spec: CellSpec) -> Path:
    return Path(root) / spec.profile / spec.benchmark / spec.attack / f"{spec.defense}.parquet"


def _read_rows(path: Path) -> pl.DataFrame | None:
    if not path.is_file():
        return None
    try:
        return pl.read_parquet(path)
    except Exception as exc:  # a torn or foreign file: say which and how to recover
        raise ConfigError(
            f"Cannot read the cell results {path} ({exc}); delete the file to re-run the cell (LLM calls stay cached)."
        ) from exc


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Atomic: a crash mid-write leaves the previous complete file, never a torn one."""
    with atomic_path(path) as temp:
        pl.DataFrame(rows, infer_schema_length=None).write_parquet(temp)


class LlmStats:
    """Reads the call counters of a CachedChatModel (calls, hits, inference seconds, and the original
    inference seconds of the answers served from the cache)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def snapshot(self) -> tuple[int, int, float, float]:
        stats = getattr(self.llm, "stats", None)
        if stats is None:
            return (0, 0, 0.0, 0.0)
        return (
            int(stats.calls),
            int(stats.hits),
            float(stats.inference_seconds),
            float(getattr(stats, "replayed_seconds", 0.0)),
        )


EpisodeRunner = Callable[[Scenario, Path], Mapping[str, Any]]


@dataclass
class CellWork:
    """One cell's plan: the episodes it still needs (``todo``, scenario-id order) and the rows it keeps, filled in
    by ``run_cells``."""

    spec: CellSpec
    run_episode: EpisodeRunner
    path: Path
    code_version: str
    wanted: dict[str, str]  # scenario id -> episode key
    todo: list[Scenario]
    stored: dict[str, dict[str, Any]]  # episode key -> row (rows of other samples of the cell stay in the file)
    root: Path
    rerun: bool = False
    seconds: float = 0.0  # reading the stored rows + this cell's episodes
    llm_calls: int = 0
    llm_cache_hits: int = 0
    inference_seconds: float = 0.0
    replayed_seconds: float = 0.0


def plan_cell(
    spec: CellSpec,
    scenarios: Sequence[Scenario],
    run_episode: EpisodeRunner,
    *,
    model_id: str,
    settings_fingerprint: str,
    root: Path,
    code_version: str | None = None,
    rerun: bool = False,
    attack_fingerprint: str = "",
) -> CellWork:
    """Which of the cell's episodes must run: a stored row is reused only if its key and its ``code_version``
    (default: this process's) match; ``rerun=True`` plans every episode of the sample again."""
    started = time.perf_counter()
    version = code_version or current_code_version()
    path = cell_path(root, spec)
    existing = _read_rows(path)
    done: dict[str, dict[str, Any]] = {}
    if existing is not None and "episode_key" in existing.columns:
        done = {row["episode_key"]: row for row in existing.iter_rows(named=True)}
    ordered = sorted(scenarios, key=lambda s: s.scenario_id)
    wanted = {
        s.scenario_id: episode_key(s.scenario_id, spec.defense, model_id, settings_fingerprint, attack_fingerprint)
        for s in ordered
    }
    todo = [
        s
        for s in ordered
        if rerun or wanted[s.scenario_id] not in done or done[wanted[s.scenario_id]].get("code_version") != version
    ]
    work = CellWork(spec, run_episode, path, version, wanted, todo, dict(done), Path(root), rerun)
    work.seconds = time.perf_counter() - started
    return work


def _run_episode(work: CellWork, scenario: Scenario, stats: LlmStats, model_id: str) -> None:
    """One episode of ``work``; its row is saved before the next episode starts."""
    started = time.perf_counter()
    spec = work.spec
    before = stats.snapshot()
    workdir = work.root / "episodes" / spec.profile / spec.attack / spec.defense / _safe(scenario.scenario_id)
    row = dict(work.run_episode(scenario, workdir))
    after = stats.snapshot()
    replayed = after[3] - before[3]
    wall = row.get("latency_s")
    row.update(
        episode_key=work.wanted[scenario.scenario_id],
        attack=spec.attack,
        model_id=model_id,
        code_version=work.code_version,
        llm_calls=after[0] - before[0],
        llm_cache_hits=after[1] - before[1],
        llm_inference_s=round(after[2] - before[2], 4),
        llm_replayed_s=round(replayed, 4),
    )
    if isinstance(wall, (int, float)):  # latency as if every answer had been computed here
        row.update(wall_latency_s=wall, latency_s=round(wall + replayed, 4))
    work.stored[row["episode_key"]] = row
    _write_rows(work.path, sorted(work.stored.values(), key=lambda r: (r["scenario_id"], r["episode_key"])))
    work.llm_calls += after[0] - before[0]
    work.llm_cache_hits += after[1] - before[1]
    work.inference_seconds += after[2] - before[2]
    work.replayed_seconds += replayed
    work.seconds += time.perf_counter() - started


def _finished(work: CellWork) -> CellRun:
    keys = set(work.wanted.values())
    rows = sorted((row for key, row in work.stored.items() if key in keys), key=lambda r: r["scenario_id"])
    frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    run = CellRun(
        spec=work.spec,
        rows=frame,
        reused_episodes=len(work.wanted) - len(work.todo),
        new_episodes=len(work.todo),
        llm_calls=work.llm_calls,
        llm_cache_hits=work.llm_cache_hits,
        llm_inferences=work.llm_calls - work.llm_cache_hits,
        inference_seconds=work.inference_seconds,
        wall_seconds=work.seconds,
        path=work.path,
        code_version=work.code_version,
        replayed_seconds=work.replayed_seconds,
        rerun=work.rerun,
    )
    run.metrics = cell_metrics(frame)
    return run


def run_cells(works: Sequence[CellWork], *, llm: Any, model_id: str, progress: bool = True) -> list[CellRun]:
    """The planned cells' missing episodes, scenario by scenario: one scenario's episodes under every attack and
    defense of ``works`` run back to back, so the prompt prefix they share (system prompt, task, the tool output up
    to the injection) is still in the model's KV snapshots when the next one starts (cell by cell, a sample of 100
    long contexts pushes it out first). Outcomes do not depend on the order (temperature 0, reused KV positions
    bit-identical to cold ones); each row is saved when its episode ends, so an interrupted run resumes. Returns one
    ``CellRun`` per work, in the order given."""
    stats = LlmStats(llm)
    queue = sorted(
        ((scenario.scenario_id, index, scenario) for index, work in enumerate(works) for scenario in work.todo),
        key=lambda item: (item[0], item[1]),
    )
    bars = _progress_bars(works) if progress else {}
    try:
        for _, index, scenario in queue:
            _run_episode(works[index], scenario, stats, model_id)
            if index in bars:
                bars[index].update()
    finally:
        for bar in {id(bar): bar for bar in bars.values()}.values():
            bar.close()
    return [_finished(work) for work in works]


def _progress_bars(works: Sequence[CellWork]) -> dict[int, Any]:
    """A bar per cell with episodes to run, stacked on a terminal; where stderr is a log (Dagster, a file) stacked
    bars would write cursor moves, so the cells share one bar there."""
    pending = [index for index, work in enumerate(works) if work.todo]
    if len(pending) > 1 and not sys.stderr.isatty():
        names = sorted({f"{works[i].spec.profile}/{works[i].spec.benchmark}" for i in pending})
        shared = tqdm(
            total=sum(len(works[i].todo) for i in pending),
            desc=f"{', '.join(names)}: {len(pending)} cells",
            unit="episode",
        )
        return dict.fromkeys(pending, shared)
    return {
        index: tqdm(total=len(works[index].todo), desc=works[index].spec.cell_id, unit="episode", position=slot)
        for slot, index in enumerate(pending)
    }


def run_cell(
    spec: CellSpec,
    scenarios: Sequence[Scenario],
    run_episode: EpisodeRunner,
    *,
    llm: Any,
    model_id: str,
    settings_fingerprint: str,
    root: Path,
    progress: bool = True,
    code_version: str | None = None,
    rerun: bool = False,
    attack_fingerprint: str = "",
) -> CellRun:
    """Run the cell's missing episodes (in scenario-id order) and return all its rows.

    ``scenarios`` are already rewritten by the cell's attack; ``attack_fingerprint`` names what decided
    their text ("" for the benchmark's own) and enters every episode key. ``run_episode(scenario, workdir)``
    returns one flat row (EpisodeResult.to_row()); the row is saved before the next episode starts, so
    nothing finished is lost if the process dies. A stored row is reused only if its key and its
    ``code_version`` (default: this process's) match; ``rerun=True`` re-runs every episode of the sample
    against the current code (replacing its stored rows). Several cells on the same scenarios: ``run_cells``.
    """
    work = plan_cell(
        spec,
        scenarios,
        run_episode,
        model_id=model_id,
        settings_fingerprint=settings_fingerprint,
        root=root,
        code_version=code_version,
        rerun=rerun,
        attack_fingerprint=attack_fingerprint,
    )
    return run_cells([work], llm=llm, model_id=model_id, progress=progress)[0]


def _safe(scenario_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in scenario_id)


# ---------------------------------------------------------------------------------------- metrics


def wilson_ci(successes: int, n: int, level: float = CI_LEVEL) -> tuple[float, float]:
    """Wilson score interval for a proportion (sane at 0/n and n/n, unlike the normal approximation)."""
    if n == 0:
        return (float("nan"), float("nan"))
    from scipy.stats import binomtest  # scipy.stats (seconds cold): only when a table is computed

    interval = binomtest(successes, n).proportion_ci(confidence_level=level, method="wilson")
    return (float(interval.low), float(interval.high))


def bootstrap_mean_ci(values: Sequence[float], level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile bootstrap CI of a mean (fixed seed, so tables are reproducible)."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return (float("nan"), float("nan"))
    if np.all(array == array[0]):
        return (float(array[0]), float(array[0]))
    from scipy.stats import bootstrap  # scipy.stats (seconds cold): only when a table is computed

    result = bootstrap(
        (array,),
        np.mean,
        confidence_level=level,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(CI_SEED),
    )
    return (float(result.confidence_interval.low), float(result.confidence_interval.high))


def cell_metrics(rows: pl.DataFrame) -> dict[str, float]:
    """ASR, security, utility (with 95% CIs), latency, certificates, episodes a defense stopped before
    generation (``aborted``); errored episodes are counted and left out of the rates (they are neither a
    success nor a defended attack)."""
    if rows.is_empty():
        return {"n": 0, "errors": 0}
    errors = rows.filter(pl.col("error").is_not_null()) if "error" in rows.columns else rows.clear()
    ok = rows.filter(pl.col("error").is_null()) if "error" in rows.columns else rows
    n = ok.height
    attacks = int(ok["attack_succeeded"].sum()) if n else 0
    asr_low, asr_high = wilson_ci(attacks, n)
    utility = ok["utility"].cast(pl.Float64).to_list() if n else []
    u_low, u_high = bootstrap_mean_ci(utility)
    certificates = ok["certificate_path"].drop_nulls().len() if "certificate_path" in ok.columns else 0
    latency = ok["latency_s"].mean() if n else float("nan")
    if not isinstance(latency, (int, float)):  # EpisodeResult.latency_s is a non-null float: the mean is one
        raise TypeError(f"The mean of latency_s is {latency!r}, not a number.")
    verified = int(ok["certificate_verified"].fill_null(False).sum()) if "certificate_verified" in ok.columns else 0
    aborted = int(ok["aborted"].is_not_null().sum()) if "aborted" in ok.columns else 0  # hfer stopped them
    # an episode with no tool result never read an injected tool output: an ASR of 0 there says nothing of a defense
    tool_read = int((ok["tool_calls"] > 0).sum()) if "tool_calls" in ok.columns else 0
    return {
        "n": n,
        "errors": errors.height,
        "asr": attacks / n if n else float("nan"),
        "asr_ci_low": asr_low,
        "asr_ci_high": asr_high,
        "security": 1 - attacks / n if n else float("nan"),
        "security_ci_low": 1 - asr_high,
        "security_ci_high": 1 - asr_low,
        "utility": float(np.mean(utility)) if utility else float("nan"),
        "utility_ci_low": u_low,
        "utility_ci_high": u_high,
        "latency_s": float(latency),
        "certificates_emitted": int(certificates),
        "certificates_verified": verified,
        "aborted": aborted,
        "tool_output_read": tool_read,
    }


def attack_table(runs: Sequence[CellRun]) -> pl.DataFrame:
    """Table 1: one row per cell (benchmark, attack, defense), metrics with CIs and the cell's code version,
    in the order given."""
    records = [
        {
            "profile": r.spec.profile,
            "benchmark": r.spec.benchmark,
            "attack": getattr(r.spec, "attack", NATIVE),
            "defense": r.spec.defense,
            **r.metrics,
            **({"code_version": r.code_version} if getattr(r, "code_version", "") else {}),
        }
        for r in runs
    ]
    return pl.DataFrame(records, infer_schema_length=None)


def _pct(value: float, low: float, high: float) -> str:
    if value != value:  # NaN
        return "–"
    return f"{100 * value:.1f}% [{100 * low:.0f}, {100 * high:.0f}]"


def _read(row: dict) -> str:
    """Episodes that received a tool result (where an injected output could reach the agent) of the cell's n."""
    read = row.get("tool_output_read")
    return "–" if read is None else f"{read}/{row['n']}"


def table_markdown(table: pl.DataFrame) -> str:
    """Table 1 as the paper prints it, plus CIs and certificate counts."""
    lines = [
        "| Benchmark | Attack | Defense | n | ASR [95% CI] | Security | Utility [95% CI] | Read a tool output "
        "| Latency (s) | Certificates |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table.iter_rows(named=True):
        utility = row.get("utility", float("nan"))
        u = "–" if utility != utility else f"{utility:.3f} [{row['utility_ci_low']:.2f}, {row['utility_ci_high']:.2f}]"
        certs = (
            "–"
            if not row.get("certificates_emitted")
            else f"{row['certificates_verified']}/{row['certificates_emitted']} verify"
        )
        errors = f" ({row['errors']} errors)" if row.get("errors") else ""
        if row.get("aborted"):  # episodes a defense stopped before generation (hfer's switch fired)
            errors += f" ({row['aborted']} stopped)"
        security = _pct(
            row.get("security", float("nan")), row.get("security_ci_low", 0), row.get("security_ci_high", 0)
        )
        lines.append(
            f"| {row['benchmark']} | {row.get('attack') or NATIVE} | {row['defense']} | {row['n']}{errors} | "
            f"{_pct(row.get('asr', float('nan')), row.get('asr_ci_low', 0), row.get('asr_ci_high', 0))} | "
            f"{security} | "
            f"{u} | {_read(row)} | {row.get('latency_s', float('nan')):.2f} | {certs} |"
        )
    return "\n".join(lines)


def plot_attack_table(table: pl.DataFrame, path: Path, title: str) -> Path:
    """ASR and utility per defense with their CIs, one panel per benchmark (columns) and attack (rows): easier
    to read than the table, and an attack's rows line up under the native ones."""
    import matplotlib  # matplotlib (seconds cold): only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "attack" not in table.columns:
        table = table.with_columns(pl.lit(NATIVE).alias("attack"))
    benchmarks = list(dict.fromkeys(table["benchmark"].to_list()))
    attacks = list(dict.fromkeys(table["attack"].to_list()))
    fig, axes = plt.subplots(
        len(attacks), len(benchmarks), figsize=(4.5 * len(benchmarks), 3.6 * len(attacks)), squeeze=False
    )
    panels = [
        (axes[i][j], attack, benchmark) for i, attack in enumerate(attacks) for j, benchmark in enumerate(benchmarks)
    ]
    for ax, attack, benchmark in panels:
        part = table.filter((pl.col("benchmark") == benchmark) & (pl.col("attack") == attack))
        if part.is_empty():
            ax.set_axis_off()
            continue
        x = np.arange(part.height)
        for offset, metric, colour in ((-0.2, "asr", "tab:red"), (0.2, "utility", "tab:blue")):
            values = part[metric].to_numpy()
            low = values - part[f"{metric}_ci_low"].to_numpy()
            high = part[f"{metric}_ci_high"].to_numpy() - values
            ax.bar(
                x + offset,
                values,
                0.4,
                yerr=[low, high],
                capsize=3,
                color=colour,
                label=metric.upper() if metric == "asr" else "utility",
            )
        ax.set_xticks(x, part["defense"].to_list(), rotation=30, ha="right")
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{benchmark} · {attack}")
    axes[0][0].legend(loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    write_stream_atomically(path, lambda handle: fig.savefig(handle, format="png", dpi=110))
    plt.close(fig)
    return path
