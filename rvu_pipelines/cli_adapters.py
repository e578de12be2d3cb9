"""``rvu adapters check PATH`` / ``allow SHA256`` / ``report`` / ``plan``: the adapter gate and the zoo from the shell.

``check`` runs exactly what a load runs (``adapters.admission.LoadGate``: the file checks, an operator's allow
entry, the lists, the behavioural layers from the screening table or scored on the spot), records the verdict in
the gate's ledger and prints it. Exit codes: 0 admitted, 1 refused (the reason code is printed), 2 the command
could not judge (no such path, no base model).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
if not console.is_terminal:
    console = Console(width=200)


def _base_model(base: Path | None, profile: str | None) -> tuple[Any, Path]:
    """The base the adapter must fit: ``--base`` GGUF, else the profile's agent model (shapes read from the GGUF)."""
    from rvu_pipelines.adapters.files import BaseModelInfo

    if base is not None:
        return BaseModelInfo.from_gguf(base), base
    from rvu_pipelines.models import ModelStore, load_model_config

    resolved = ModelStore().resolve("llm", load_model_config().profile(profile)["llm"])
    return BaseModelInfo.from_gguf(resolved.path, name=resolved.name, sha256=resolved.sha256), Path(resolved.path)


def _show(verdict: Any) -> None:
    colour = "green" if verdict.admitted else "red"
    console.print(
        f"[{colour}]{verdict.decision.upper()}[/{colour}] {escape(verdict.adapter_id)} "
        f"({escape(verdict.reason)}): {escape(verdict.message)}",
        highlight=False,
        soft_wrap=True,
    )
    table = Table(title=f"gate verdict, sha256 {verdict.sha256[:16]}…, scored: {verdict.scored}, draw: {verdict.draw}")
    for column in ("check", "value", "threshold", "rejects"):
        table.add_column(column)
    table.add_row("lists", verdict.lists, "", "")
    for layer, judged in verdict.layers.items():
        table.add_row(layer, f"{judged['score']:.4g}", f"{judged['threshold']:.4g}", str(judged["rejects"]))
    console.print(table)


@click.group()
def adapters() -> None:
    """LoRA adapters: the gate every load goes through."""


@adapters.command("check")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--base", type=click.Path(path_type=Path, exists=True, dir_okay=False), help="Base model GGUF.")
@click.option("--profile", default=None, help="Model profile whose agent model is the base (default: tiny).")
@click.option("--scores", type=click.Path(path_type=Path), default=None, help="Screening table (scores.csv).")
@click.option("--score/--no-score", default=True, help="Score on the spot when the table lacks the adapter.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.option("--store", default=None, help="Also log the verdict in this provenance store (a path or postgresql://).")
def check(
    path: Path,
    base: Path | None,
    profile: str | None,
    scores: Path | None,
    score: bool,
    as_json: bool,
    store: str | None,
) -> None:
    """Screen the adapter folder PATH as a load would; exit 0 admitted, 1 refused, 2 cannot judge."""
    from rvu_pipelines.adapters.admission import LoadGate
    from rvu_pipelines.adapters.gate import load_gate_config
    from rvu_pipelines.errors import InputFileError
    from rvu_pipelines.paths import state_dir

    if not path.exists():
        console.print(f"[red]error:[/red] no adapter folder at {escape(str(path))}.", highlight=False)
        sys.exit(2)
    try:
        info, _ = _base_model(base, profile)
    except (OSError, ValueError, KeyError) as exc:
        console.print(f"[red]error:[/red] the base model is not available: {escape(str(exc))}", highlight=False)
        sys.exit(2)
    config = load_gate_config()
    try:
        gate = LoadGate.from_state(info, state_dir(), config=config, scores_csv=scores)
    except InputFileError as exc:  # e.g. gate.probe_draw is private and its secret is missing or exposed
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        sys.exit(2)
    with contextlib.ExitStack() as stack:
        if store is not None:
            from rvu_pipelines.adapters.admission import store_recorder
            from rvu_pipelines.provenance import open_store

            gate.recorders.append(store_recorder(stack.enter_context(open_store(store))))
        _judge(gate, path, profile, score, as_json)


def _judge(gate: Any, path: Path, profile: str | None, score: bool, as_json: bool) -> None:
    from rvu_pipelines.adapters.errors import AdapterRefused

    try:
        _, verdict = gate.check_folder(path) if not score else _check_with_scorer(gate, path, profile)
    except AdapterRefused as exc:
        if as_json:
            print(json.dumps({"decision": "refuse", "reason": exc.reason, "message": str(exc), "draw": gate.draw.id}))
        else:
            console.print(f"[red]REFUSE[/red] ({exc.reason}): {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(1)
    if as_json:
        print(json.dumps(verdict.record(), sort_keys=True, default=str))
    else:
        _show(verdict)
    sys.exit(0 if verdict.admitted else 1)


def _check_with_scorer(gate: Any, path: Path, profile: str | None) -> tuple[Any, Any]:
    """File checks first (cheap); the base is loaded for scoring only when the verdict needs a score."""
    from rvu_pipelines.adapters.errors import AdapterRefused
    from rvu_pipelines.adapters.files import verify_adapter

    try:
        adapter = verify_adapter(path, gate.base)
    except AdapterRefused:
        return gate.check_folder(path)  # refuses it again and records the refusal
    if adapter.sha256 not in gate.screened and gate.thresholds and adapter.sha256 not in gate.allow:
        from rvu_pipelines.adapters.draw_scoring import LazyLabScorer
        from rvu_pipelines.models import load_model_config

        name = load_model_config().profile_name(profile)
        gate.scorer = LazyLabScorer(name, gate.config.reference_adapter, draw=gate.draw)
    return adapter, gate.check(adapter)  # the verified adapter is judged as is: its files are not read twice


@adapters.command("allow")
@click.argument("sha256")
@click.option("--by", required=True, help="Who allows it (recorded).")
@click.option("--reason", required=True, help="Why (recorded).")
@click.option("--adapter-id", default="", help="The adapter's id, for people reading the list.")
def allow(sha256: str, by: str, reason: str, adapter_id: str) -> None:
    """Admit the adapter whose weights have SHA256 whatever the gate says: an explicit, recorded override."""
    from rvu_pipelines.adapters.admission import LEDGER_NAME, GateLedger, add_allow_entry, allow_path, gate_dir
    from rvu_pipelines.errors import InputFileError
    from rvu_pipelines.paths import state_dir

    sha256 = sha256.strip().lower()  # tools print a sha256 in either case; the gate compares lower case
    try:
        entry = add_allow_entry(allow_path(state_dir()), sha256, by=by, reason=reason, adapter_id=adapter_id)
    except (InputFileError, ValueError) as exc:  # a bad sha256 / empty reason, or an allow list that cannot be read
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        sys.exit(2)
    GateLedger(gate_dir(state_dir()) / LEDGER_NAME).append({"event": "allow", "sha256": sha256, **entry})
    console.print(f"allowed {sha256[:16]}… by {escape(by)}: {escape(reason)}", highlight=False)


@adapters.command("report")
@click.option("--scores", type=click.Path(path_type=Path), default=None, help="Screening table (scores.csv).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Folder for gate.md (default: the table's).")
def report(scores: Path | None, out: Path | None) -> None:
    """Evaluate the gate's rules again over a stored screening table (default: the adapter study's): gate.md,
    summary.json and coverage.json under the gate's and the zoo's current config, without loading a model or an
    adapter. The goal's verdict fails while the table leaves out an evaluated zoo entry."""
    from rvu_pipelines.adapters.gate import load_gate_config
    from rvu_pipelines.adapters.gate_goal import (
        ZooCoverage,
        auroc_goal_verdict,
        goal_block,
        pooled_interval,
        record_coverage,
    )
    from rvu_pipelines.adapters.study import STUDY_FOLDER, read_gate_scores, write_gate_report
    from rvu_pipelines.adapters.zoo import load_zoo_config
    from rvu_pipelines.atomic_write import write_atomically
    from rvu_pipelines.errors import InputFileError
    from rvu_pipelines.paths import state_dir

    table = scores or state_dir() / STUDY_FOLDER / "scores.csv"
    folder = out or table.parent
    try:
        rows = read_gate_scores(table)
        written = write_gate_report(rows, load_gate_config(), folder, command="rvu adapters report", write_table=False)
        if (folder / "scores.csv").resolve() != table.resolve():  # the report's folder carries the table it read
            write_atomically(folder / "scores.csv", table.read_bytes())
        coverage = ZooCoverage.of([e.id for e in load_zoo_config().adapters], [r.adapter_id for r in rows])
    except (InputFileError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        sys.exit(2)
    screened = written.evaluation.trigger_free.get("all_layers")
    verdict = auroc_goal_verdict(screened.auroc if screened is not None else float("nan"), coverage)
    interval = pooled_interval([r.gate_scores() for r in rows])
    record_coverage(folder, coverage, verdict, interval)
    evaluation = written.evaluation
    console.print(
        f"{evaluation.n_benign} benign + {evaluation.n_harmful} harmful adapters: {folder / 'gate.md'}",
        highlight=False,
    )
    console.print(goal_block(coverage, verdict, interval), highlight=False)


@adapters.command("plan")
@click.option("--profile", default=None, help="Model profile whose agent model the zoo is trained on.")
@click.option("--ids", "ids_only", is_flag=True, help="Print only the adapter ids, one per line (for a shell loop).")
def plan(profile: str | None, ids_only: bool) -> None:
    """Which zoo adapters (configs/adapter_zoo.yaml) a training pass would reuse and which it would train, and why;
    reads the data sets and the adapters on disk, loads no model."""
    from rvu_pipelines.adapters.zoo import catalog_frames, load_zoo_config, training_plan, zoo_ids
    from rvu_pipelines.models import ModelStore, load_model_config

    if ids_only:
        click.echo("\n".join(zoo_ids()))
        return
    llm = ModelStore().resolve("llm", load_model_config().profile(profile)["llm"])
    rows = training_plan(load_zoo_config(), catalog_frames(), llm.sha256)
    table = Table(title=f"adapter zoo on {llm.name} ({llm.sha256[:12]}…)")
    for column in ("adapter", "action", "why"):
        table.add_column(column)
    for row in rows:
        table.add_row(escape(row["adapter_id"]), row["action"], escape(row["why"]))
    console.print(table)
    trained = sum(r["action"] == "train" for r in rows)
    console.print(f"{trained} to train, {len(rows) - trained} reused", highlight=False)


@adapters.group("draw")
def draw() -> None:
    """The gate's private probe draw: a secret seed, and the operator's adapters screened on it."""


def _fail(exc: Exception) -> NoReturn:
    console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
    sys.exit(2)


@draw.command("new")
@click.option("--rotate", is_flag=True, help="Replace an existing secret (its screening table is then stale).")
def draw_new(rotate: bool) -> None:
    """Make the private draw's secret (a random seed, mode 0600); prints its id, never the seed."""
    from rvu_pipelines.adapters.gate import load_gate_config
    from rvu_pipelines.adapters.probe_draw import new_secret, secret_path
    from rvu_pipelines.errors import InputFileError
    from rvu_pipelines.paths import state_dir

    config = load_gate_config()
    path = secret_path(config, state_dir())
    try:
        made = new_secret(path, rotate=rotate)
    except InputFileError as exc:
        _fail(exc)
    console.print(f"probe draw {made.id}: secret at {escape(str(path))} (mode 0600)", highlight=False)
    if config.probe_draw != "private":
        console.print("set gate.probe_draw: private in configs/adapters.yaml for the gate to read it", highlight=False)
    console.print("next: `rvu adapters draw screen` scores your known-good adapters on it", highlight=False)


@draw.command("show")
def draw_show() -> None:
    """The draw the gate reads now, where its screening table is, and what that table holds."""
    from rvu_pipelines.adapters.admission import read_screening_table
    from rvu_pipelines.adapters.gate import load_gate_config
    from rvu_pipelines.adapters.probe_draw import configured_draw, screening_table_path
    from rvu_pipelines.errors import InputFileError
    from rvu_pipelines.paths import state_dir

    state = state_dir()
    try:
        current = configured_draw(load_gate_config(), state)
        table = screening_table_path(state, current)
        rows = read_screening_table(table)
    except InputFileError as exc:
        _fail(exc)
    benign = sum(row.get("label") == "benign" for row in rows)
    console.print(f"probe draw: {current.id}", highlight=False)
    console.print(f"screening table: {escape(str(table))} ({len(rows)} adapters, {benign} benign)", highlight=False)
    summary = table.parent / "draw.json"
    if current.private and summary.is_file():
        console.print_json(summary.read_text())


@draw.command("screen")
@click.option("--profile", default=None, help="Model profile whose agent model is the base (default: tiny).")
@click.option("--adapter", "ids", multiple=True, help="Zoo adapter id to screen (repeatable; default: every trained).")
def draw_screen(profile: str | None, ids: tuple[str, ...]) -> None:
    """Score the zoo's trained adapters on the private draw and write its screening table: the benign rows set the
    thresholds every later load is judged against. Needs gate.probe_draw: private and its secret."""
    from rvu_pipelines.adapters.draw_scoring import screen_private_draw
    from rvu_pipelines.adapters.gate import load_gate_config
    from rvu_pipelines.adapters.probe_draw import configured_draw, screening_table_path
    from rvu_pipelines.adapters.study import AdapterLab
    from rvu_pipelines.adapters.zoo import load_zoo_config, trained_entries, zoo_root
    from rvu_pipelines.errors import InputFileError
    from rvu_pipelines.models import load_model_config
    from rvu_pipelines.paths import state_dir
    from rvu_pipelines.result_memo import ResultMemo

    state, config = state_dir(), load_gate_config()
    try:
        current = configured_draw(config, state)
    except InputFileError as exc:
        _fail(exc)
    if not current.private:
        _fail(ValueError("gate.probe_draw is 'public': its screening table is the adapter study's (make adapters)."))
    zoo = load_zoo_config()
    unknown = sorted(set(ids) - {entry.id for entry in zoo.adapters})
    if unknown:
        _fail(ValueError(f"not zoo adapters (configs/adapter_zoo.yaml): {', '.join(unknown)}"))
    chosen = [e.id for e in trained_entries(zoo.adapters) if not ids or e.id in ids]
    if not chosen:
        _fail(ValueError(f"no trained zoo adapter under {zoo_root()}; train the zoo first (make adapters)."))
    lab = AdapterLab.for_profile(load_model_config().profile_name(profile))
    table = screening_table_path(state, current)
    summary = screen_private_draw(
        lab,
        current,
        [lab.verify(i) for i in chosen],
        lab.verify(config.reference_adapter),
        config,
        table,
        memo=ResultMemo.default(),
    )
    console.print(
        f"draw {current.id}: {summary['adapters']} adapters ({summary['benign']} benign) scored on "
        f"{summary['n_prompts']} private probes; table {escape(str(table))}",
        highlight=False,
    )
