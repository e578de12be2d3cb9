"""The per-scenario GCG attack: a string optimised on the one held-out scenario it is planted in, warm-started from
the attacker's own goal, refused anywhere else, and measured by the real agent on llama.cpp beside its PyTorch
verdict (the transfer the table reports)."""

import dataclasses

import pytest

from rvu_pipelines.attacks.catalog import AttackContext, attack_fingerprint, attacked
from rvu_pipelines.attacks.gcg import GcgConfig, GcgOptimizer
from rvu_pipelines.attacks.optimised import PER_SCENARIO, per_scenario_path, per_scenario_strings
from rvu_pipelines.attacks.planted_call import target_text
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.redteam.decision_point import capture

TINY = GcgConfig(n_tokens=20, steps=2, candidates=8, top_k=16, seed=3)


@pytest.fixture(scope="module")
def held_out():
    """The first two scenarios of the attack table's held-out InjecAgent dh sample."""
    from rvu_pipelines.redteam.table import heldout_sample

    return heldout_sample("injecagent_dh", 2)


@pytest.fixture(scope="module")
def own_string(dequantized, capture_settings, held_out, tmp_path_factory):
    """A real (tiny, warm-started) per-scenario optimisation for the first held-out scenario."""
    from rvu_pipelines.redteam.optimise import optimise_string

    model, tokenizer, sha = dequantized
    folder = tmp_path_factory.mktemp("strings")
    stored = optimise_string(
        PER_SCENARIO,
        profile="tiny",
        model_sha256=sha,
        model=model,
        tokenizer=tokenizer,
        scenarios=[held_out[0]],
        settings=capture_settings,
        config=dataclasses.replace(TINY, init_text=" " + target_text(held_out[0])),
        state_path=folder / "state.json",
        strings_dir=folder,
        progress=False,
    )
    return folder, stored


def test_the_warm_start_begins_at_the_goal_and_lowers_the_loss_of_reaching_it(dequantized, capture_settings, held_out):
    import torch

    model, tokenizer, sha = dequantized
    slot = capture(held_out[0], tokenizer, capture_settings).slot
    warm_config = dataclasses.replace(TINY, init_text=" " + target_text(held_out[0]))
    cold, warm = (GcgOptimizer(model, tokenizer, [slot], c, sha) for c in (TINY, warm_config))
    warm_ids = warm.initial_ids()
    assert tokenizer.decode(warm_ids).startswith(" " + target_text(held_out[0])) and len(warm_ids) == 20
    assert cold.fingerprint != warm.fingerprint
    cold_loss, _ = cold.losses(torch.tensor([cold.initial_ids()]))
    warm_loss, _ = warm.losses(torch.tensor([warm_ids]))
    assert float(warm_loss[0]) < float(cold_loss[0])
    with pytest.raises(ConfigError, match="more than n_tokens"):
        GcgOptimizer(model, tokenizer, [slot], dataclasses.replace(warm_config, n_tokens=3), sha).initial_ids()


def test_a_per_scenario_string_acts_only_in_its_own_scenario(own_string, held_out, dequantized):
    folder, stored = own_string
    sha = dequantized[2]
    assert stored.train_scenarios == (held_out[0].scenario_id,) and stored.steps == 2
    assert per_scenario_path(folder, "tiny", held_out[0].scenario_id).is_file()
    context = AttackContext("tiny", sha, "vanilla", folder)
    assert set(per_scenario_strings(context)) == {held_out[0].scenario_id}
    assert attacked(held_out[0], PER_SCENARIO, context).injection == held_out[0].injection + stored.text
    with pytest.raises(ConfigError, match="No gcg_per_scenario string for"):
        attacked(held_out[1], PER_SCENARIO, context)
    with pytest.raises(ConfigError, match="does not carry over between weights"):
        attacked(held_out[0], PER_SCENARIO, AttackContext("tiny", "0" * 64, "vanilla", folder))
    assert attack_fingerprint(PER_SCENARIO, context).startswith(f"{PER_SCENARIO}:")


def test_a_string_filed_under_another_scenario_is_refused(own_string, held_out, dequantized, tmp_path):
    folder, _ = own_string
    moved = per_scenario_path(tmp_path, "tiny", held_out[1].scenario_id)
    moved.parent.mkdir(parents=True)
    moved.write_bytes(per_scenario_path(folder, "tiny", held_out[0].scenario_id).read_bytes())
    with pytest.raises(ConfigError, match="not on"):
        attacked(held_out[1], PER_SCENARIO, AttackContext("tiny", dequantized[2], "vanilla", tmp_path))


def test_the_table_runs_the_row_where_strings_exist_and_says_why_elsewhere(own_string, held_out, dequantized):
    from rvu_pipelines.redteam.table import own_string_sample, unavailable

    folder, _ = own_string
    context = AttackContext("tiny", dequantized[2], "vanilla", folder)
    assert [s.scenario_id for s in own_string_sample("injecagent_dh", context)] == [held_out[0].scenario_id]
    assert unavailable(PER_SCENARIO, "vanilla", context, "injecagent_dh") is None
    assert "--benchmark injecagent_ds" in unavailable(PER_SCENARIO, "vanilla", context, "injecagent_ds")


def test_the_table_runs_the_string_and_its_control_on_the_same_scenarios_and_counts_the_transfer(
    own_string, held_out, string_harness
):
    """ASR is the agent's on llama.cpp (quantised GGUF); the planted-call control runs on the same scenarios; a
    benchmark without strings is listed as not run; the transfer summary counts the PyTorch verdict beside it."""
    from rvu_pipelines.redteam.table import (
        TablePlan,
        per_scenario_cells,
        run_table,
        study_markdown,
        transfer_summary,
    )

    folder, stored = own_string
    harness = string_harness(folder)
    plan = TablePlan(("injecagent_dh", "bipia_email"), ("planted_call", PER_SCENARIO), ("vanilla",), 1, "per_scenario")
    runs, skipped = run_table(harness, plan, progress=False)
    assert [(r.spec.attack, r.rows["scenario_id"].to_list()) for r in runs] == [
        ("planted_call", [held_out[0].scenario_id]),  # the control on the very scenarios the strings were made for
        (PER_SCENARIO, [held_out[0].scenario_id]),
    ]
    assert {(c["benchmark"], c["attack"]) for c in skipped} == {
        ("bipia_email", "planted_call"),
        ("bipia_email", PER_SCENARIO),
    }
    run = runs[1]
    row = run.rows.row(0, named=True)
    assert row["attack"] == PER_SCENARIO and row["error"] is None
    summary = transfer_summary(runs, per_scenario_cells(plan, harness.attack_context))
    succeeded = int(bool(row["attack_succeeded"]))
    assert summary == [
        {
            "attack": PER_SCENARIO,
            "defense": "vanilla",
            "strings": 1,
            "solved_pytorch": int(stored.solved),
            "succeeded_llama_cpp": succeeded,
            "solved_and_succeeded": int(stored.solved) * succeeded,
        }
    ]
    import polars as pl

    from rvu_pipelines.attacks.paired import paired_attack_tests
    from rvu_pipelines.redteam.table import CONTROLS, episode_rows

    against = paired_attack_tests(episode_rows(runs), CONTROLS)
    assert against.select(["attack", "control", "n_pairs"]).rows() == [(PER_SCENARIO, "planted_call", 1)]
    text = study_markdown(pl.DataFrame(), pl.DataFrame(), [], summary, against)
    assert f"| {PER_SCENARIO} | vanilla | 1 | {int(stored.solved)} | {succeeded} |" in text
    assert "| injecagent_dh | vanilla | gcg_per_scenario | planted_call | 1 |" in text


def test_a_warm_start_for_a_string_shared_by_many_scenarios_is_refused_before_any_model_loads():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "scripts/optimise_attack.py", "--name", "gcg_universal", "--warm-start"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "applies to gcg_per_scenario only" in done.stderr
