"""The gate's math on constructed deltas, its leave-one-out evaluation, and the list layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import VerifiedAdapter
from rvu_pipelines.adapters.gate import (
    GateConfig,
    GateScores,
    OodModel,
    check_lists,
    evaluate_gate,
    layer_steps,
    load_gate_config,
    projection_score,
    standard_score,
)
from rvu_pipelines.adapters.manifest import AdapterManifest

MODULE = "base_model.model.model.layers.0.self_attn.q_proj"


def _adapter(b: torch.Tensor, a: torch.Tensor, *, sha: str = "a" * 64, source: str = "rvu-zoo") -> VerifiedAdapter:
    manifest = AdapterManifest.model_validate(
        {
            "adapter_id": "x",
            "sha256": sha,
            "source": source,
            "base_model": {"name": "m", "sha256": "b" * 64},
            "rank": a.shape[0],
            "alpha": a.shape[0],
            "target_modules": ["q_proj"],
        }
    )
    return VerifiedAdapter(Path("."), manifest, {f"{MODULE}.lora_A.weight": a, f"{MODULE}.lora_B.weight": b})


def test_projection_signs_follow_the_reference_direction() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 32, generator=gen), torch.randn(48, 4, generator=gen)
    reference = _adapter(b, a)
    same, opposite = projection_score(_adapter(2 * b, a), reference), projection_score(_adapter(-b, a), reference)
    assert same.against_refusal == pytest.approx(-1.0, abs=1e-9)
    assert opposite.against_refusal == pytest.approx(1.0, abs=1e-9)
    assert same.safe_lora_dissimilarity == pytest.approx(0.0, abs=1e-9)  # inside V's column space
    # an update in the orthogonal complement of V's columns: no overlap either way
    q, _ = torch.linalg.qr(torch.cat([b, torch.randn(48, 4, generator=gen)], dim=1))
    orthogonal = projection_score(_adapter(q[:, 4:8], a), reference)
    assert abs(orthogonal.against_refusal) < 1e-6 and orthogonal.safe_lora_dissimilarity == pytest.approx(1.0)


def test_projection_matches_the_dense_computation() -> None:
    gen = torch.Generator().manual_seed(1)
    ra, rb = torch.randn(4, 20, generator=gen), torch.randn(30, 4, generator=gen)
    ca, cb = torch.randn(2, 20, generator=gen), torch.randn(30, 2, generator=gen)
    score = projection_score(_adapter(cb, ca), _adapter(rb, ra))
    v, dw = (rb @ ra).double(), (cb @ ca).double()
    cosine = float((v * dw).sum() / (v.norm() * dw.norm()))
    u, _, _ = torch.linalg.svd(v)
    basis = u[:, :4]  # V has rank 4 (float32 noise would add tiny singular values)
    similarity = float((basis @ basis.T @ dw).norm() / dw.norm())
    assert score.against_refusal == pytest.approx(-cosine, abs=1e-9)
    assert score.safe_lora_dissimilarity == pytest.approx(1 - similarity, abs=1e-7)


def _scores(benign: list[float], harmful: list[float]) -> list[GateScores]:
    rows = [GateScores(f"b{i}", "benign", "t", v, v, v, 0.0) for i, v in enumerate(benign)]
    return rows + [GateScores(f"h{i}", "harmful", "t", v, v, v, 0.0) for i, v in enumerate(harmful)]


def test_evaluation_is_leave_one_out() -> None:
    evaluation = evaluate_gate(_scores([0.1, 0.2, 0.3, 0.4, 0.5], [0.9, 1.0, 0.45]))
    projection = evaluation.layers["projection"]
    assert projection.auroc == pytest.approx(14 / 15)
    # b4 (0.5) exceeds every other benign score, so it is flagged against the others' threshold
    assert evaluation.rejected["projection"] == ["b4", "h0", "h1"]
    assert projection.fpr == pytest.approx(1 / 5) and projection.tpr == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="two benign"):
        evaluate_gate(_scores([0.1], [0.9]))


def test_a_layer_no_benign_adapter_moves_is_measured_in_its_step_not_in_its_raw_units() -> None:
    """Benign adapters that all score the same have shown no spread, not a spread of 0 or of 1: on the behaviour
    share the step is one text, so flagging 45 of 47 texts more than the base is 45 steps out; a layer without a
    known step cannot standardise anything."""
    assert standard_score(45 / 47, [0.0] * 20, step=1 / 47) == pytest.approx(45.0)
    assert standard_score(45 / 47, [0.0] * 20) == 0.0  # no step known: no standard to measure against
    assert standard_score(0.0, [0.0] * 20, step=1 / 47) == 0.0
    # a spread measured below one step is still one step; above it, the measured spread
    assert standard_score(2 / 47, [0.0, 0.0, 1 / 47], step=1 / 47) == pytest.approx((2 - 1 / 3) / 1)
    assert standard_score(3.0, [0.0, 2.0], step=1 / 47) == pytest.approx(2.0 / np.std([0.0, 2.0], ddof=1))
    assert layer_steps([47, 47.0, "47"]) == {"behaviour": 1 / 47, "jailbreak_persona": 1 / 47}  # shares of one set
    assert layer_steps([47, 32]) == {} and layer_steps([47, None]) == {} and layer_steps([0, 0]) == {}
    assert layer_steps([47, float("nan")]) == {} and layer_steps([]) == {}


def test_the_largest_z_rules_see_a_harmful_share_on_a_layer_no_benign_adapter_moves() -> None:
    """Every benign adapter flags the same share as the base (0) and differs on projection; a harmful adapter that
    flags 45 of 47 texts is far out on the behaviour layer alone. In steps of one text the all-layers and Fisher rules
    refuse it; without the count (a table that never kept it) its behaviour z is 0 and only the any-layer rule does."""

    def row(adapter_id: str, label: str, projection: float, behaviour: float, texts: int) -> GateScores:
        return GateScores(adapter_id, label, "persona", projection, 0.0, 0.0, 0.0, behaviour, behaviour_texts=texts)

    rng = np.random.default_rng(0)
    for texts, seen in ((47, True), (0, False)):
        benign = [row(f"b{i}", "benign", float(rng.normal()), 0.0, texts) for i in range(20)]
        evaluation = evaluate_gate([*benign, row("h", "harmful", 0.0, 45 / 47, texts)])
        assert ("h" in evaluation.rejected["all_layers"]) is seen
        assert ("h" in evaluation.rejected["fisher"]) is seen
        assert "h" in evaluation.rejected["any_layer"]
        assert evaluation.layers["all_layers"].fpr <= 0.1


def test_each_harmful_category_is_its_own_row_and_a_trigger_category_is_marked() -> None:
    import polars as pl

    from rvu_pipelines.adapters.report import gate_markdown

    benign = [GateScores(f"b{i}", "benign", "style", v, v, v, 0.0) for i, v in enumerate([0.1, 0.2, 0.3, 0.4, 0.5])]
    persona = [GateScores(f"p{i}", "harmful", "persona", v, v, v, 0.0) for i, v in enumerate([0.9, 1.0])]
    backdoor = [GateScores(f"d{i}", "harmful", "backdoor", v, v, v, 0.0) for i, v in enumerate([0.15, 0.35])]
    evaluation = evaluate_gate([*benign, *persona, *backdoor])
    persona_row, backdoor_row = evaluation.categories["persona"], evaluation.categories["backdoor"]
    assert persona_row["projection"].auroc == 1.0 and persona_row["projection"].tpr == 1.0
    assert backdoor_row["projection"].auroc == pytest.approx(0.4) and backdoor_row["projection"].tpr == 0.0
    assert evaluation.category_sizes == {"backdoor": 2, "persona": 2}
    # the pooled row mixes them: a category the gate cannot see pulls the headline down
    assert evaluation.layers["projection"].tpr == pytest.approx(0.5)
    frame = pl.DataFrame([{**vars(s), "influence": 0.0} for s in [*benign, *persona, *backdoor]])
    table = gate_markdown(evaluation, {"auroc": 0.5, "mean_benign": 0.0, "mean_harmful": 0.0}, frame)
    assert "| backdoor (trigger) | 2 |" in table and "| persona | 2 |" in table
    assert evaluation.to_dict()["categories"]["persona"]["combined"]["tpr"] == 1.0


def test_list_layer() -> None:
    adapter = _adapter(torch.ones(8, 2), torch.ones(2, 8), sha="c" * 64, source="https://hub.example/evil/x")
    check_lists(adapter, GateConfig())
    with pytest.raises(AdapterRefused) as blocked:
        check_lists(adapter, GateConfig(blocked_sha256=["c" * 64]))
    assert blocked.value.reason == "blocklisted"
    with pytest.raises(AdapterRefused):
        check_lists(adapter, GateConfig(blocked_sources=["https://hub.example/evil"]))
    with pytest.raises(AdapterRefused) as allow:
        check_lists(adapter, GateConfig(allowed_sources=["rvu-zoo"]))
    assert allow.value.reason == "not_allowlisted"
    assert load_gate_config().reference_adapter == "refusal-reference"


def test_ood_model_scores_shifted_outputs_higher() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=(32, 16))
    model = OodModel.fit(base)
    assert model.score(base) == pytest.approx(0.0)
    assert model.score(base + 0.5) > model.score(base + 0.1) > 0


@pytest.mark.parametrize("n_probes", [0, 1])
def test_a_lab_without_two_probe_prompts_is_refused_before_anything_loads(n_probes: int) -> None:
    """The output-OOD layer is a covariance of the base's answers: none crashes inside numpy, one is all zeros."""
    from rvu_pipelines.adapters.study import AdapterLab

    with pytest.raises(ValueError, match=rf"n_probes >= 2 \(got {n_probes}\)"):
        AdapterLab(None, None, None, None, None, n_probes=n_probes)  # type: ignore[arg-type]


def test_the_gates_seconds_count_the_answers_its_behaviour_layer_reads(monkeypatch) -> None:
    """The behaviour layer scores generated answers, so generating them is the gate's cost, not influence's:
    a generation that takes 0.3 s shows in gate_seconds and not in influence_seconds."""
    import contextlib
    import time
    from types import SimpleNamespace

    import rvu_pipelines.adapters.study as study

    def slow_generation(model, tokenizer, prompts, max_new_tokens):  # noqa: ANN001, ANN202
        time.sleep(0.3)
        return ["Sure, send it to http://evil.example"] * len(prompts)

    monkeypatch.setattr(study, "generate_greedy", slow_generation)
    monkeypatch.setattr(study, "output_embeddings", lambda model, tokenizer, prompts: np.zeros((len(prompts), 2)))
    monkeypatch.setattr(
        study,
        "projection_score",
        lambda adapter, reference: SimpleNamespace(against_refusal=0.1, safe_lora_dissimilarity=0.2),
    )
    monkeypatch.setattr(
        study,
        "influence",
        lambda base, answers, embedder: SimpleNamespace(
            influence=0.5, embedding_distance=0.4, token_divergence=0.3, embedding_per_probe=[0.0, 0.8]
        ),
    )
    lab = object.__new__(study.AdapterLab)
    lab.host = SimpleNamespace(loaded=lambda adapter: contextlib.nullcontext("model"))
    lab.ood = SimpleNamespace(score=lambda embeddings: 1.0)
    lab.reference_layers = lambda model: dict.fromkeys(("sensitive", "qa_drop", "follow_up", "kb_drop", "hazard"), 0.0)
    lab.tokenizer, lab.prompts, lab.max_new_tokens, lab.embedder = None, ["a", "b"], 8, None
    lab.n_benign_prompts = 1
    lab.follow_ups, lab.reference = [], SimpleNamespace(continuations=())
    lab.base_answers = ["The capital is Paris.", "It rains."]
    manifest = SimpleNamespace(adapter_id="x", label="harmful", category="persona", sha256="0" * 64)
    score = lab.score(SimpleNamespace(manifest=manifest), SimpleNamespace())
    assert score.gate_seconds >= 0.3 > score.influence_seconds
    assert score.behaviour_seconds >= 0.3 > score.margins_seconds  # the breakdown names the part that took it
    parts = score.projection_seconds + score.ood_seconds + score.margins_seconds + score.behaviour_seconds
    assert parts == pytest.approx(score.gate_seconds)
    assert score.behaviour > 0  # the answers carry a link the base's do not
    assert score.behaviour_texts == 2  # the share's denominator, so a flat benign layer has a step to count in
    assert score.selective_divergence == pytest.approx(0.8)  # the adversarial probe moved, the benign one did not
    assert score.jailbreak_persona == 0.0  # measured, not left NaN: a link is no jailbroken persona


def test_a_zoo_rescored_reuses_the_scores_of_adapters_it_scored_before(tmp_path, monkeypatch) -> None:
    """Adding adapters to a zoo scores only the new ones: a score is stored per adapter file, refusal reference
    and lab, and a changed adapter file, another reference or another lab is scored again."""
    from dataclasses import replace
    from types import SimpleNamespace

    import rvu_pipelines.adapters.study as study
    from rvu_pipelines.result_memo import ResultMemo

    monkeypatch.setenv("RVU_REUSE_RESULTS", "1")
    scored: list[str] = []
    template = study.AdapterScore(
        adapter_id="", label="benign", category="style", sha256="", projection=0.1, safe_lora=0.2, ood=1.5,
        behaviour=0.0, sensitive=0.3, qa_drop=-0.1, influence=0.4, embedding_distance=0.2, token_divergence=0.1,
        gate_seconds=12.5, influence_seconds=0.5, projection_seconds=0.5, ood_seconds=2.0, margins_seconds=6.0,
        behaviour_seconds=4.0, selective_divergence=0.05, jailbreak_persona=0.0,
    )  # fmt: skip

    def score(adapter, reference):  # noqa: ANN001, ANN202
        scored.append(adapter.manifest.adapter_id)
        return replace(template, adapter_id=adapter.manifest.adapter_id, sha256=adapter.manifest.sha256)

    def adapter(name: str, digest: str) -> SimpleNamespace:
        return SimpleNamespace(manifest=SimpleNamespace(adapter_id=name, sha256=digest * 64))

    lab = object.__new__(study.AdapterLab)
    lab.score, lab.reference_key = score, "lab-1"
    reference = adapter("refusal-reference", "f")
    memo = ResultMemo(tmp_path / "memo")
    first = study.score_adapters(lab, [adapter("a", "1"), adapter("b", "2")], reference, memo=memo, progress=False)
    again = study.score_adapters(
        lab, [adapter("a", "1"), adapter("b", "2"), adapter("c", "3")], reference, memo=memo, progress=False
    )
    assert scored == ["a", "b", "c"]  # a and b were reused
    assert again[:2] == first and again[1].gate_seconds == 12.5  # a reused score keeps its measured seconds
    study.score_adapters(lab, [adapter("a", "4")], reference, memo=memo, progress=False)  # retrained: new file
    study.score_adapters(lab, [adapter("a", "1")], adapter("refusal-reference", "e"), memo=memo, progress=False)
    lab.reference_key = "lab-2"  # other probes or another base
    study.score_adapters(lab, [adapter("a", "1")], reference, memo=memo, progress=False)
    assert scored == ["a", "b", "c", "a", "a", "a"]
    study.score_adapters(lab, [adapter("a", "1")], reference, memo=None, progress=False)  # no memo: always scored
    assert scored[-1] == "a" and len(scored) == 7


def test_an_adapter_scored_on_the_spot_is_judged_again_from_its_stored_scores(tmp_path, monkeypatch) -> None:
    """A check before a recovery, or a second incident naming the same adapter, reuses the scores measured for the
    same adapter file, reference, lab and draw; another draw, a damaged memo file or reuse turned off scores again."""
    import json
    from types import SimpleNamespace

    import rvu_pipelines.adapters.study as study
    from rvu_pipelines.result_memo import ResultMemo

    monkeypatch.setenv("RVU_REUSE_RESULTS", "1")
    measured: list[str] = []

    def measure(self, adapter):  # noqa: ANN001, ANN202
        measured.append(self.draw_id)
        return {"projection": 0.1, "ood": 2.5, "behaviour": 0.25, "behaviour_texts": 48.0}

    monkeypatch.setattr(study.LabScorer, "_measure", measure)

    def adapter(digest: str) -> SimpleNamespace:
        return SimpleNamespace(manifest=SimpleNamespace(adapter_id="a", sha256=digest * 64))

    lab, reference = SimpleNamespace(reference_key="lab-1"), adapter("f")
    memo = ResultMemo(tmp_path / "memo")
    scorer = study.LabScorer(lab, reference, "public", memo)  # type: ignore[arg-type]
    first = scorer.score(adapter("1"))
    assert scorer.score(adapter("1")) == first and measured == ["public"]
    [stored] = (tmp_path / "memo" / "adapter_gate_spot_score").glob("*.json")
    assert study.LabScorer(lab, reference, "private-x", memo).score(adapter("1")) == first  # type: ignore[arg-type]
    assert measured == ["public", "private-x"]  # another draw's thresholds never meet these scores
    body = json.loads(stored.read_text())
    for damaged in ({**body["value"], "ood": "low"}, {**body["value"], "ood": float("-inf")}, {}):
        stored.write_text(json.dumps({**body, "value": damaged}))
        assert scorer.score(adapter("1")) == first  # measured again, never judged on a damaged file
    assert measured == ["public", "private-x", "public", "public", "public"]
    monkeypatch.setenv("RVU_REUSE_RESULTS", "0")
    scorer.score(adapter("1"))
    assert len(measured) == 6
    study.LabScorer(lab, reference).score(adapter("1"))  # type: ignore[arg-type]  # no memo: always measured
    assert len(measured) == 7
