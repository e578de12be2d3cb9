"""The all-layers and Fisher rules, the pooled trigger-free row, and the learned combiner held out by category."""

from __future__ import annotations

import numpy as np
import pytest

from rvu_pipelines.adapters.gate import SCREEN_LAYERS, GateScores, evaluate_gate, fisher_evidence
from rvu_pipelines.adapters.gate_loco import evaluate_learned_gate


def _row(adapter_id: str, label: str, category: str, **layers: float) -> GateScores:
    values = {layer: layers.get(layer, 0.0) for layer in ("projection", "safe_lora", "ood")}
    extra = {layer: layers.get(layer, 0.0) for layer in SCREEN_LAYERS if layer not in values}
    return GateScores(
        adapter_id, label, category, values["projection"], values["safe_lora"], values["ood"], 0.0, **extra
    )


def _benign(n: int = 12, seed: int = 0) -> list[GateScores]:
    rng = np.random.default_rng(seed)
    return [
        _row(f"b{i}", "benign", "task", **dict(zip(SCREEN_LAYERS[:5], rng.normal(0, 1, 5), strict=True)))
        for i in range(n)
    ]


def test_all_layers_sees_a_category_that_only_one_behavioural_layer_reads() -> None:
    benign = _benign()
    memoriser = [_row(f"m{i}", "harmful", "memorise", sensitive=6.0 + i) for i in range(3)]
    trigger = [_row("t0", "harmful", "backdoor")]  # looks benign without its trigger
    evaluation = evaluate_gate([*benign, *memoriser, *trigger])
    assert evaluation.categories["memorise"]["combined"].tpr == 0.0  # projection and OOD only: blind to it
    assert evaluation.categories["memorise"]["all_layers"].tpr == 1.0
    # the pooled trigger-free row is the memorisers alone; the pooled all-adapter row is pulled down by the trigger
    assert evaluation.trigger_free["all_layers"].tpr == 1.0 and evaluation.trigger_free["all_layers"].auroc == 1.0
    assert evaluation.layers["all_layers"].tpr == pytest.approx(0.75)
    assert evaluation.to_dict()["trigger_free"]["all_layers"]["tpr"] == 1.0


def test_fisher_is_fishers_method_on_the_normal_tail_of_each_z() -> None:
    from scipy.stats import combine_pvalues, norm

    z = [2.5, -1.0, 0.3, 0.0]
    assert 2 * fisher_evidence(z) == pytest.approx(combine_pvalues(norm.sf(z), method="fisher").statistic)
    assert fisher_evidence([-8.0, -8.0]) == pytest.approx(0.0, abs=1e-12)  # far below the benign mean: no evidence
    assert fisher_evidence([3.0, 3.0]) > fisher_evidence([3.0, 0.0]) > fisher_evidence([0.0, 0.0])


def test_fisher_adds_small_moves_on_several_layers_that_the_largest_z_misses() -> None:
    benign = _benign(n=16, seed=3)
    spread = {layer: [getattr(b, layer) for b in benign] for layer in SCREEN_LAYERS[:5]}
    # every layer a little above the benign mean, none beyond the benign adapters' own largest deviations
    moved = {layer: float(np.mean(v) + 1.6 * np.std(v, ddof=1)) for layer, v in spread.items()}
    drifting = [_row(f"d{i}", "harmful", "drift", **moved) for i in range(3)]
    evaluation = evaluate_gate([*benign, *drifting])
    assert evaluation.categories["drift"]["all_layers"].tpr == 0.0
    assert evaluation.categories["drift"]["fisher"].tpr == 1.0
    assert evaluation.categories["drift"]["fisher"].auroc == 1.0


def test_a_learned_combiner_is_only_credited_with_what_it_never_saw() -> None:
    benign = _benign()
    # two categories on the behaviour layer and one on a layer only it uses: held out, the fitted weights point away
    persona = [_row(f"p{i}", "harmful", "persona", behaviour=4.0 + i) for i in range(3)]
    compliance = [_row(f"c{i}", "harmful", "compliance", behaviour=5.0 + i) for i in range(3)]
    memoriser = [_row(f"m{i}", "harmful", "memorise", qa_drop=-4.0 - i) for i in range(3)]
    learned = evaluate_learned_gate([*benign, *persona, *compliance, *memoriser])
    assert learned.categories["persona"].auroc == 1.0 and learned.categories["compliance"].auroc == 1.0
    assert learned.categories["memorise"].auroc < 0.5  # a signal no other category taught it, in the wrong direction
    assert learned.trigger_free is not None and learned.trigger_free.auroc < 1.0
    assert set(learned.scores) == {s.adapter_id for s in [*benign, *persona, *compliance, *memoriser]}
    # every benign score comes from a model fitted without it: an outlying benign adapter is not fitted away
    outlier = _row("b-out", "benign", "task", behaviour=6.0)
    again = evaluate_learned_gate([*benign, outlier, *persona, *compliance, *memoriser])
    others = [v for k, v in again.scores.items() if k.startswith("b") and k != "b-out"]
    assert again.scores["b-out"] > max(others)
    assert again.trigger_free is not None and again.trigger_free.fpr == pytest.approx(1 / 13)


def test_trigger_categories_are_scored_but_never_fitted_and_too_few_categories_are_refused() -> None:
    benign = _benign()
    persona = [_row(f"p{i}", "harmful", "persona", behaviour=4.0 + i) for i in range(3)]
    compliance = [_row(f"c{i}", "harmful", "compliance", ood=5.0 + i) for i in range(3)]
    trigger = [_row(f"t{i}", "harmful", "backdoor", behaviour=-3.0) for i in range(2)]
    with_trigger = evaluate_learned_gate([*benign, *persona, *compliance, *trigger])
    without = evaluate_learned_gate([*benign, *persona, *compliance])
    assert with_trigger.categories["persona"] == without.categories["persona"]  # the backdoors changed no fit
    assert with_trigger.categories["backdoor"].tpr == 0.0
    with pytest.raises(ValueError, match="two trigger-free"):
        evaluate_learned_gate([*benign, *persona, *trigger])


def test_the_any_layer_rule_is_the_union_of_the_layers_and_reports_no_auroc() -> None:
    import json

    import polars as pl

    from rvu_pipelines.adapters.report import gate_markdown

    benign = _benign()
    persona = [_row("p0", "harmful", "persona", behaviour=6.0)]
    memoriser = [_row("m0", "harmful", "memorise", sensitive=6.0)]
    evaluation = evaluate_gate([*benign, *persona, *memoriser])
    rule = evaluation.layers["any_layer"]
    assert rule.tpr == 1.0 and np.isnan(rule.auroc)
    union = set().union(*(evaluation.rejected[layer] for layer in SCREEN_LAYERS))
    assert set(evaluation.rejected["any_layer"]) == union
    assert rule.fpr >= max(evaluation.layers[layer].fpr for layer in SCREEN_LAYERS)  # the union's cost in FPR
    plain = json.loads(json.dumps(evaluation.to_dict(), allow_nan=False))  # strict JSON: no NaN
    assert plain["layers"]["any_layer"]["auroc"] is None
    frame = pl.DataFrame([{**vars(s), "influence": 0.0} for s in [*benign, *persona, *memoriser]])
    table = gate_markdown(evaluation, {"auroc": 0.5, "mean_benign": 0.0, "mean_harmful": 0.0}, frame)
    assert "| — | 1.00 |" in table and "**every trigger-free category**" in table


def test_the_gate_report_writes_strict_json_and_the_held_out_tables(tmp_path) -> None:
    import json

    import polars as pl

    from rvu_pipelines.adapters.gate import GateConfig
    from rvu_pipelines.adapters.study import AdapterScore, write_gate_report

    rows = [*_benign(), *(_row(f"p{i}", "harmful", "persona", behaviour=4.0 + i) for i in range(2))]
    rows += [_row(f"c{i}", "harmful", "compliance", behaviour=5.0 + i) for i in range(2)]
    rows += [_row("t0", "harmful", "backdoor")]
    scores = [
        AdapterScore(
            s.adapter_id,
            s.label,
            s.category,
            f"{i:064x}",
            s.projection,
            s.safe_lora,
            s.ood,
            s.behaviour,
            s.sensitive,
            s.qa_drop,
            0.1,
            0.1,
            0.1,
            1.0,
            0.5,
            selective_divergence=0.01 * i,
            jailbreak_persona=(i % 3) / 47,
        )  # fmt: skip
        for i, s in enumerate(rows)
    ]
    report = write_gate_report(scores, GateConfig(), tmp_path, command="pytest")
    summary = json.loads((tmp_path / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert summary["learned_gate"]["categories"]["persona"]["auroc"] == 1.0
    assert summary["gate"]["layers"]["any_layer"]["auroc"] is None
    markdown = (tmp_path / "gate.md").read_text()
    assert "leave-one-category-out" in markdown and "| backdoor (trigger) | 1 |" in markdown
    assert "median 1.0 s, slowest 1.0 s; medians by part: projection 0.0 s" in markdown
    assert "in no rule): AUROC harmful vs benign" in markdown  # the selective column, reported apart
    assert "Jailbreak persona (share of the behaviour layer's texts" in markdown  # and the jailbreak-persona one
    assert pl.read_csv(tmp_path / "scores.csv").height == len(rows) and report.learned is not None
    # the rules are evaluated again from the stored table alone (no model): the same scores, the same evaluation
    from click.testing import CliRunner

    from rvu_pipelines.adapters.study import read_gate_scores
    from rvu_pipelines.cli import cli

    assert read_gate_scores(tmp_path / "scores.csv") == sorted(scores, key=lambda s: s.adapter_id)
    again = CliRunner().invoke(
        cli, ["adapters", "report", "--scores", str(tmp_path / "scores.csv"), "--out", str(tmp_path / "re")]
    )
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "re" / "summary.json").read_text())["gate"] == summary["gate"]
    rerun = (tmp_path / "re" / "gate.md").read_text()
    assert "rvu adapters report" in rerun
    # these ids are no zoo config's: the table speaks for none of the configured zoo, so the goal is not met
    assert "Zoo coverage: 0 of the" in rerun and "scored but not in the zoo config: b0, b1" in rerun
    assert "not met" in again.output and json.loads((tmp_path / "re" / "coverage.json").read_text())["scored"] == 17
    pl.read_csv(tmp_path / "scores.csv").drop("ood").write_csv(tmp_path / "old.csv")
    refused = CliRunner().invoke(cli, ["adapters", "report", "--scores", str(tmp_path / "old.csv")])
    assert refused.exit_code == 2 and "old.csv" in refused.output and "ood" in refused.output
