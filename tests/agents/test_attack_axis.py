"""The attack axis of the attack table: a cell is benchmark × attack × defense. Native cells keep the episode keys
they have without an attack (stored rows and LLM answers stay reusable); any other attack gets its own keys, its
own results file and its own golden cells; an unknown attack name is refused naming the field."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from rvu_pipelines.agents.evaluation import CellSpec, attack_table, cell_path, episode_key, run_cell, table_markdown
from rvu_pipelines.agents.regression import (
    Tolerance,
    compare_to_golden,
    golden_path,
    golden_subset,
    load_golden,
    write_golden,
)
from rvu_pipelines.attacks import catalog
from rvu_pipelines.attacks.catalog import AttackContext, AttackSpec
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.axes import NATIVE

PLEASE = "please"  # a test-only attack: the native injection with " PLEASE" appended


@dataclass(frozen=True)
class _Scenario:
    scenario_id: str
    benchmark: str = "canonical"
    user_task: str = "task"
    injection: str = "injection"
    task_tools: frozenset[str] = frozenset()


@pytest.fixture
def please(monkeypatch: pytest.MonkeyPatch) -> AttackSpec:
    spec = AttackSpec(
        PLEASE,
        "appends PLEASE",
        rewrite=lambda scenario, _context: dataclasses.replace(scenario, injection=scenario.injection + " PLEASE"),
        fingerprint=lambda context: f"suffix-v1:{context.defense}",
    )
    catalog.registered()  # plugins first, so the test entry is not raced by a later load
    monkeypatch.setitem(catalog._REGISTRY, PLEASE, spec)
    return spec


def _context(defense: str = "vanilla") -> AttackContext:
    return AttackContext(profile="tiny", model_sha256="m", defense=defense, strings_dir=Path("/nonexistent"))


def _row(scenario: Any, _workdir: Path) -> dict[str, Any]:
    return {
        "scenario_id": scenario.scenario_id,
        "benchmark": scenario.benchmark,
        "defense": "vanilla",
        "attack_succeeded": scenario.injection.endswith("PLEASE"),
        "utility": 1.0,
        "latency_s": 0.1,
        "error": None,
    }


def test_native_keys_are_the_benchmarks_own_and_another_attack_gets_its_own(tmp_path: Path, please) -> None:
    native_fp = catalog.attack_fingerprint(NATIVE, _context())
    assert native_fp == ""
    old = hashlib.sha256(json.dumps(["s0", "vanilla", "m", "f"], sort_keys=True).encode()).hexdigest()
    assert episode_key("s0", "vanilla", "m", "f", native_fp) == old == episode_key("s0", "vanilla", "m", "f")

    other_fp = catalog.attack_fingerprint(PLEASE, _context())
    assert other_fp == "please:suffix-v1:vanilla"
    assert episode_key("s0", "vanilla", "m", "f", other_fp) != old
    assert catalog.attack_fingerprint(PLEASE, _context("rvg")) != other_fp  # the defense decides this attack's text

    native, attacked = CellSpec("canonical", "vanilla", "tiny"), CellSpec("canonical", "vanilla", "tiny", attack=PLEASE)
    assert native.attack == NATIVE and native.cell_id == "tiny/canonical/native/vanilla"
    assert cell_path(tmp_path, native) == tmp_path / "tiny" / "canonical" / "native" / "vanilla.parquet"
    assert cell_path(tmp_path, attacked) == tmp_path / "tiny" / "canonical" / PLEASE / "vanilla.parquet"

    scenarios = [_Scenario(f"s{i}") for i in range(3)]
    common = {"llm": None, "model_id": "m", "settings_fingerprint": "f", "root": tmp_path, "progress": False}
    first = run_cell(native, scenarios, _row, **common)
    rewritten = [catalog.attacked(s, PLEASE, _context()) for s in scenarios]
    second = run_cell(attacked, rewritten, _row, attack_fingerprint=other_fp, **common)
    assert first.new_episodes == second.new_episodes == 3  # no row of one attack is reused by the other
    assert first.rows["attack"].to_list() == [NATIVE] * 3 and second.rows["attack"].to_list() == [PLEASE] * 3
    assert first.rows["episode_key"][0] == old
    assert set(first.rows["episode_key"]).isdisjoint(second.rows["episode_key"])
    assert first.metrics["asr"] == 0.0 and second.metrics["asr"] == 1.0
    assert first.path != second.path and first.path.is_file() and second.path.is_file()

    table = attack_table([first, second])
    assert table["attack"].to_list() == [NATIVE, PLEASE]
    assert "| canonical | please | vanilla | 3 |" in table_markdown(table)


def _harness(tmp_path: Path):
    from rvu_pipelines.agents.harness import Harness

    class _Model:
        name = "fake"

        def chat(self, messages, **kwargs):  # never called: the episodes are faked
            raise AssertionError("no LLM call expected")

    return Harness.open(
        _Model(),
        profile="tiny",
        model_id="m",
        detector="heuristic",
        root=tmp_path / "attacks",
        cache_path=tmp_path / "cache.sqlite",
        gguf_path=tmp_path / "model.gguf",
    )


def test_harness_rewrites_each_scenario_and_keys_the_episodes_by_attack(
    tmp_path: Path, please, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rvu_pipelines.agents.episode as episode

    seen: list[tuple[str, str, Path]] = []

    class _Result:
        def __init__(self, row: dict[str, Any]) -> None:
            self.row = row

        def to_row(self) -> dict[str, Any]:
            return self.row

    def fake_run_episode(scenario, defense, llm, settings, workdir):
        seen.append((scenario.injection, defense, Path(workdir)))
        return _Result({**_row(scenario, workdir), "defense": defense})

    monkeypatch.setattr(episode, "run_episode", fake_run_episode)
    harness = _harness(tmp_path)
    context = harness.attack_context("rvg")
    assert context.gguf_path == tmp_path / "model.gguf" and context.strings_dir.name == "attacks"
    assert context.defense == "rvg" and context.model_sha256 == "m" and context.profile == "tiny"

    scenarios = [_Scenario("s0")]
    native = harness.run_cell("canonical", "vanilla", scenarios=scenarios, progress=False)
    runs = harness.run_table("canonical", ["vanilla", "rvg"], scenarios=scenarios, progress=False, attack=PLEASE)
    assert [injection for injection, _, _ in seen] == ["injection", "injection PLEASE", "injection PLEASE"]
    assert [r.spec.attack for r in runs] == [PLEASE, PLEASE] and native.spec.attack == NATIVE
    assert seen[0][2].parts[-4:] == ("tiny", NATIVE, "vanilla", "s0")  # the workdir names the attack
    assert seen[1][2].parts[-4:] == ("tiny", PLEASE, "vanilla", "s0")
    fingerprint = harness.settings_fingerprint("vanilla")
    assert native.rows["episode_key"][0] == episode_key("s0", "vanilla", "m", fingerprint)
    assert runs[0].rows["episode_key"][0] == episode_key("s0", "vanilla", "m", fingerprint, "please:suffix-v1:vanilla")

    with pytest.raises(ConfigError, match=r"Unknown attack 'nope'"):
        harness.run_cell("canonical", "vanilla", attack="nope", scenarios=scenarios, progress=False)
    with pytest.raises(ConfigError, match=r"Unknown attack 'nope'"):
        harness.run_table("canonical", ["vanilla"], attack="nope", scenarios=scenarios, progress=False)


def test_asset_config_refuses_an_unknown_attack_naming_the_field() -> None:
    from assets.attacks import SamplesConfig, Table1Config, chosen_attacks

    assert Table1Config().attacks == [NATIVE] and SamplesConfig().attacks == [NATIVE]
    assert chosen_attacks([NATIVE, NATIVE]) == [NATIVE]
    with pytest.raises(ConfigError, match=r"Unknown attacks 'nope'; allowed values: no_attack, native"):
        chosen_attacks([NATIVE, "nope"])
    with pytest.raises(ConfigError, match=r"`attacks` is empty"):
        chosen_attacks([])


def _table(attack: str, asr: float) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {"benchmark": "canonical", "attack": attack, "defense": d, "n": 10, "errors": 0, "asr": asr, "utility": 0.5}
            for d in ("vanilla", "rvg")
        ]
    )


def test_golden_round_trip_keys_cells_by_attack(tmp_path: Path) -> None:
    path = write_golden(_table(NATIVE, 0.1), "tiny", "sha", tmp_path / "golden.json")
    native = load_golden(path)
    assert sorted(native["cells"]) == ["canonical/native/rvg", "canonical/native/vanilla"]
    assert compare_to_golden(_table(NATIVE, 0.1), native, Tolerance()) == []

    write_golden(_table(PLEASE, 0.9), "tiny", "sha", path, attacks=[PLEASE])  # beside the native cells
    both = load_golden(path)
    assert {c: v for c, v in both["cells"].items() if "/native/" in c} == native["cells"]
    assert both["cells"]["canonical/please/vanilla"]["asr"] == 0.9
    assert compare_to_golden(pl.concat([_table(NATIVE, 0.1), _table(PLEASE, 0.9)]), both, Tolerance()) == []
    # a native-only table is compared with the native golden cells only
    assert compare_to_golden(_table(NATIVE, 0.1), golden_subset(both, None, [NATIVE]), Tolerance()) == []
    drifts = compare_to_golden(_table(NATIVE, 0.1), both, Tolerance())
    assert {d.cell for d in drifts} == {"canonical/please/rvg", "canonical/please/vanilla"}
    # one defense under one attack
    only = golden_subset(both, ["rvg"], [PLEASE])
    assert list(only["cells"]) == ["canonical/please/rvg"]
    write_golden(_table(PLEASE, 0.5).filter(pl.col("defense") == "rvg"), "tiny", "sha", path, only=["rvg"])
    after = load_golden(path)["cells"]
    assert (
        after["canonical/please/rvg"]["asr"] == 0.5
        and after["canonical/native/rvg"] == native["cells"]["canonical/native/rvg"]
    )
    assert "canonical/native/rvg" in after  # only the cells of the table's attacks are replaced

    path.write_text(json.dumps({"cells": {"canonical/vanilla": {"n": 1}}}))
    with pytest.raises(ConfigError, match="benchmark/attack/defense"):
        load_golden(path)


def test_the_committed_golden_file_is_keyed_by_attack() -> None:
    cells = load_golden(golden_path("tiny"))["cells"]
    assert cells and all(cell.split("/")[:2] == ["canonical", NATIVE] for cell in cells)
