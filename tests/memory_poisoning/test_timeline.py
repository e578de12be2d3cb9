"""The write-time defender on AgentPoison's timeline: mixed histories, the random-trigger control, the retro-scan
and the incident it opens, closed by the `rvu recover` CLI (real MiniLM, real StrategyQA, tiny trigger search)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.attacks.agentpoison import RANDOM_NAME, TriggerConfig
from rvu_pipelines.memory_poisoning.defenses.memsad import MemsadDetector
from rvu_pipelines.memory_poisoning.report import retro_scan_markdown, write_time_markdown
from rvu_pipelines.memory_poisoning.study import (
    attack_defense_matrix,
    calibrations_for,
    context_for,
    history_for,
    mixed_history,
)
from rvu_pipelines.memory_poisoning.study_cells import StudyConfig, build_cell
from rvu_pipelines.memory_poisoning.timeline import (
    ScanConfig,
    ScanRun,
    retro_scan,
    retro_scan_study,
    scan_incident,
    served_stream,
)
from rvu_pipelines.provenance.entry_ids import write_entry_id
from rvu_pipelines.provenance.incident import load_incident

CONFIG = StudyConfig(
    regime="small", n_queries=60, agentpoison_poisons=5, agentpoison_train=10, trigger=TriggerConfig.tiny()
)
SCAN = ScanConfig(n_triggered=12, triggered_every=3, seeds=(0, 1))


@pytest.fixture(scope="module")
def cells(strategyqa_frame, study_embeddings):
    frames = {"agentpoison_strategyqa": strategyqa_frame}
    return {name: build_cell(name, frames, study_embeddings, CONFIG) for name in ("agentpoison", RANDOM_NAME)}


@pytest.fixture(scope="module")
def memsad_scan(cells) -> ScanRun:
    return retro_scan(cells["agentpoison"], lambda: MemsadDetector(2.0), "memsad", SCAN, seed=0)


def _has_trigger(text: str, trigger: str) -> bool:
    return text.rstrip().endswith(trigger)


def test_each_history_holds_plain_traffic_then_the_stated_share_of_triggered_queries(cells) -> None:
    cell = cells["agentpoison"]
    trigger = cell.attack.trigger
    n = len(cell.plain_history_texts)
    seen = []
    for calibration in calibrations_for(cell):
        history = history_for(cell, calibration)
        flags = [_has_trigger(t, trigger) for t in history.texts]
        assert sum(flags) == history.n_triggered and len(history.vectors) == len(history.texts)
        # plain traffic first, the triggered queries after it (they arrive with the victims)
        assert flags == sorted(flags)
        seen.append(history.n_triggered)
    assert seen[0] == 0 and seen[-1] == len(cell.history_texts)
    assert seen == sorted(seen) and len(set(seen)) >= 4
    five = mixed_history(cell, 0.05)
    assert five.n_triggered == max(1, round(0.05 * n)) and len(five.texts) == n
    # the vectors are the texts' own rows: triggered rows come from the triggered history
    np.testing.assert_array_equal(five.vectors[-1], cell.history_vectors[five.n_triggered - 1])
    with pytest.raises(MemoryPoisoningInputError, match=r"triggered share .* \[0, 1\]"):
        mixed_history(cell, 1.5)
    with pytest.raises(MemoryPoisoningInputError, match="unknown calibration 'triggered_3pct'"):
        history_for(cell, "triggered_3pct")


def test_plain_calibration_gives_no_feature_a_triggered_text(cells) -> None:
    cell = cells["agentpoison"]
    plain, triggered = context_for(cell, "plain"), context_for(cell, "triggered")
    assert plain.history_texts and not any(_has_trigger(t, cell.attack.trigger) for t in plain.history_texts)
    assert all(_has_trigger(t, cell.attack.trigger) for t in triggered.history_texts)
    assert len(plain.history_texts) == len(plain.history_vectors)


def test_the_matrix_reports_the_random_trigger_control_beside_every_history(cells) -> None:
    table, _ = attack_defense_matrix(list(cells.values()), {"memsad": lambda: MemsadDetector(2.0)})
    assert table.height == 2 * 6
    control = table.filter(pl.col("attack") == RANDOM_NAME)
    assert control.height == 6 and control["n_poisons"].to_list() == [5] * 6
    assert cells[RANDOM_NAME].attack.trigger != cells["agentpoison"].attack.trigger
    for attack in cells:
        rows = table.filter(pl.col("attack") == attack).sort("n_history_triggered")
        assert rows["calibration"][0] == "plain" and rows["calibration"][-1] == "triggered"
        assert rows["history"][0] == "plain queries only"
    markdown = write_time_markdown(table)
    assert RANDOM_NAME in markdown and "triggered_5pct" in markdown


def test_the_stream_puts_one_triggered_query_in_every_slot_it_names(cells) -> None:
    stream = served_stream(cells["agentpoison"], SCAN, seed=0)
    assert len(stream) == SCAN.n_triggered * SCAN.triggered_every
    assert [q.triggered for q in stream] == ([False] * (SCAN.triggered_every - 1) + [True]) * SCAN.n_triggered
    other = served_stream(cells["agentpoison"], SCAN, seed=1)
    assert [q.text for q in stream] != [q.text for q in other]


def test_the_retro_scan_counts_what_an_independent_replay_counts(cells, memsad_scan: ScanRun) -> None:
    cell, run = cells["agentpoison"], memsad_scan
    entries = {e.key: e for e in run.entries}
    vectors = dict(
        zip(
            [e.key for e in run.entries],
            np.concatenate([cell.memory_vectors, cell.benign_vectors, cell.poison_vectors]),
            strict=True,
        )
    )
    served_poisons = dict.fromkeys((p.key for p in cell.attack.poisons), 0)
    triggered = 0
    for t, (query, keys) in enumerate(run.retrievals, start=1):
        live = [k for k in entries if run.flagged_at.get(k, t) >= t]  # not flagged before this query
        sims = {k: float(vectors[k] @ query.vector) for k in live}
        want = sorted(live, key=lambda k: -sims[k])[: SCAN.top_k]
        assert [round(sims[k], 5) for k in keys] == [round(sims[k], 5) for k in want]
        for k in keys:
            assert run.flagged_at.get(k, t) >= t, f"{k} served at query {t} after its flag"
            if entries[k].is_poison:
                served_poisons[k] += 1
        triggered += query.triggered
        for key, at in run.flagged_at.items():
            if at == t:
                assert run.triggered_before[key] == triggered
    assert served_poisons == run.poisoned_retrievals


def test_memsad_finds_the_poisons_only_as_triggered_queries_arrive(cells) -> None:
    table, runs = retro_scan_study(list(cells.values()), {"memsad": lambda: MemsadDetector(2.0)}, SCAN)
    assert table.height == 2 and len(runs[("agentpoison", "memsad")]) == len(SCAN.seeds)
    row = table.filter(pl.col("attack") == "agentpoison").row(0, named=True)
    # the write-time check sees plain traffic only; the scan flags poisons once victims have sent the trigger
    assert row["tpr"] > row["tpr_write_time"]
    assert row["median_triggered_to_flag"] >= 1
    assert row["poisoned_retrievals_before_flag"] < row["poisoned_retrievals_undefended"]
    assert 0 <= row["fpr_low"] <= row["fpr"] <= row["fpr_high"] <= 1 and row["n_benign"] > 0
    line = next(ln for ln in retro_scan_markdown(table, 25, 0.05).splitlines() if ln.startswith("| agentpoison |"))
    assert line.endswith("| met |" if row["goal_met"] else "| not met |")


def test_a_flagging_scan_opens_an_incident_that_rvu_recover_closes(
    memsad_scan: ScanRun, tmp_path: Path, rvu_in_process
) -> None:
    run = memsad_scan
    path = scan_incident(run, tmp_path / "retro_scan.jsonl")
    assert path is not None
    log = load_incident(path)
    seeds = {r.entry_id for r in log.records if r.contaminated}
    flagged_poisons = {write_entry_id(p.key) for p in run.poisons if p.key in run.flagged_at}
    assert flagged_poisons and flagged_poisons <= seeds
    assert sum(r.action_type == "user_input" for r in log.records) == len(run.retrievals)
    home, cert = tmp_path / "home", tmp_path / "cert.json"
    done = rvu_in_process("recover", str(path), "--cert-out", str(cert), "--no-membership", env={"RVU_HOME": str(home)})
    assert done.returncode == 0, done.stdout + done.stderr
    body = json.loads(cert.read_text())["runtime_recovery"]
    assert flagged_poisons <= set(body["seed_ids"])
    removed = set(body["flagged"]) | set(body["quarantined"]) | set(body["purged"])
    assert flagged_poisons <= removed
    # every retrieval that read a flagged poison before its flag is in the closure
    reads = {r.entry_id for r in log.records if r.action_type == "memory_retrieval" and r.parent_id in flagged_poisons}
    assert reads and reads <= set(body["closure_ids"])


def test_a_scan_that_flags_nothing_opens_no_incident(memsad_scan: ScanRun, tmp_path: Path) -> None:
    never = ScanRun(memsad_scan.attack, "memsad", 0, memsad_scan.entries, {}, {}, memsad_scan.retrievals)
    assert scan_incident(never, tmp_path / "none.jsonl") is None
    assert not (tmp_path / "none.jsonl").exists()
