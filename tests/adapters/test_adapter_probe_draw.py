"""The private probe draw on the load path: a secret kept like one, a verdict that names the draw and never the
seed, thresholds from the draw's own screening table, and scores on the spot read on the same draw."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from rvu_pipelines.adapters.admission import LoadGate
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import VerifiedAdapter, save_adapter, verify_adapter
from rvu_pipelines.adapters.gate import GateConfig
from rvu_pipelines.adapters.probe_draw import (
    MIN_SECRET_SEED,
    ProbeDraw,
    configured_draw,
    new_secret,
    read_secret,
    screening_table_path,
    secret_path,
)
from rvu_pipelines.adapters.recovery_gate import ScreeningGate
from rvu_pipelines.cli import cli
from rvu_pipelines.errors import InputFileError
from rvu_pipelines.paths import project_root

FIELDS = {"source": "test", "rank": 4, "alpha": 8, "target_modules": ["v_proj", "o_proj"]}


def _benign_rows(projections: list[float]) -> list[dict]:
    return [
        {"adapter_id": f"b{i}", "sha256": f"{i:064x}", "label": "benign", "projection": p, "ood": 1.0}
        for i, p in enumerate(projections)
    ]


def test_a_new_secret_is_owner_only_kept_unless_rotated_and_its_id_hides_the_seed(tmp_path: Path) -> None:
    path = tmp_path / "gate" / "probe_draw.secret"
    made = new_secret(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert made.seed is not None and made.seed >= MIN_SECRET_SEED
    assert read_secret(path) == made
    shown = [made.id, str(made), repr(made)]
    assert made.id.startswith("private-") and not any(str(made.seed) in text for text in shown)
    with pytest.raises(InputFileError, match="already there.*--rotate"):
        new_secret(path)
    assert read_secret(path) == made  # a refused overwrite leaves the secret as it was
    rotated = new_secret(path, rotate=True)
    assert rotated.id != made.id and read_secret(path) == rotated
    assert ProbeDraw().id == "public" and not ProbeDraw().private


def test_a_secret_that_is_a_link_exposed_malformed_or_small_is_refused_naming_the_fix(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text(f"{MIN_SECRET_SEED + 5}\n")
    target.chmod(0o600)
    link = tmp_path / "link.secret"
    link.symlink_to(target)
    with pytest.raises(InputFileError, match="link"):
        read_secret(link)
    with pytest.raises(InputFileError, match="symbolic link"):
        new_secret(link, rotate=True)
    assert target.read_text() == f"{MIN_SECRET_SEED + 5}\n"  # a planted link is never written through

    def secret(name: str, text: str, mode: int = 0o600) -> Path:
        path = tmp_path / name
        path.write_text(text)
        path.chmod(mode)
        return path

    with pytest.raises(InputFileError, match=r"readable or writable by others \(mode 0644\).*chmod 600"):
        read_secret(secret("open.secret", f"{MIN_SECRET_SEED + 5}\n", 0o644))
    with pytest.raises(InputFileError, match="not one integer") as malformed:
        read_secret(secret("word.secret", "hunter2-correct-horse\n"))
    assert "hunter2" not in str(malformed.value)  # no message quotes the file
    with pytest.raises(InputFileError, match="can be enumerated"):
        read_secret(secret("small.secret", "1\n"))  # the published study's seed is no secret
    with pytest.raises(InputFileError, match="not one integer"):
        read_secret(secret("long.secret", "9" * 200))
    with pytest.raises(InputFileError, match="rvu adapters draw new"):
        read_secret(tmp_path / "missing.secret")


def test_the_configured_draw_and_its_table(tmp_path: Path) -> None:
    state = tmp_path / "home"
    assert configured_draw(GateConfig(), state) == ProbeDraw()
    assert screening_table_path(state, ProbeDraw()) == state / "adapter_study" / "scores.csv"
    private = GateConfig(probe_draw="private")
    with pytest.raises(InputFileError, match="rvu adapters draw new"):
        configured_draw(private, state)
    made = new_secret(secret_path(private, state))
    assert secret_path(private, state) == state / "adapter_gate" / "probe_draw.secret"
    assert configured_draw(private, state) == made
    assert screening_table_path(state, made) == state / "adapter_study" / "draws" / made.id / "scores.csv"
    elsewhere = GateConfig(probe_draw="private", probe_seed_file=str(tmp_path / "vault" / "seed"))
    assert secret_path(elsewhere, state) == tmp_path / "vault" / "seed"


@pytest.fixture
def candidate(gate_base, noise, tmp_path: Path) -> VerifiedAdapter:
    save_adapter(tmp_path / "zoo" / "candidate", noise(seed=3), {"adapter_id": "candidate", **FIELDS}, base=gate_base)
    return verify_adapter(tmp_path / "zoo" / "candidate", gate_base)


def test_a_private_gate_judges_against_its_own_draws_table_and_names_the_draw(gate_base, candidate, tmp_path) -> None:
    state = tmp_path / "home"
    config = GateConfig(probe_draw="private")
    made = new_secret(secret_path(config, state))
    row = {"adapter_id": "candidate", "sha256": candidate.sha256, "label": "unknown", "ood": 0.5}
    public = screening_table_path(state, ProbeDraw())
    public.parent.mkdir(parents=True)
    pl.DataFrame([*_benign_rows([0.1, 0.2, 0.3]), {**row, "projection": 0.0}]).write_csv(public)
    private = screening_table_path(state, made)
    private.parent.mkdir(parents=True)
    pl.DataFrame([*_benign_rows([0.1, 0.2, 0.3]), {**row, "projection": 0.9}]).write_csv(private)

    admitted = LoadGate.from_state(gate_base, state, config=GateConfig()).check(candidate)
    assert admitted.admitted and admitted.draw == "public"
    gate = LoadGate.from_state(gate_base, state, config=config)
    assert gate.draw == made
    with pytest.raises(AdapterRefused) as refused:
        gate.check(candidate)
    assert refused.value.reason == "gate_projection"
    ledger = [json.loads(line) for line in gate.ledger.path.read_text().splitlines()]
    assert [r["draw"] for r in ledger] == ["public", made.id]
    assert str(made.seed) not in gate.ledger.path.read_text()

    class PublicScorer:  # reads the public draw: its scores mean nothing against the private thresholds
        def score(self, adapter: VerifiedAdapter) -> dict[str, float]:
            return {"projection": 0.0, "ood": 0.0}

    unscored = verify_adapter(candidate.folder, gate_base)
    gate.screened = {}
    gate.scorer = PublicScorer()
    with pytest.raises(ValueError, match=f"probe draw {made.id} but its scorer reads public"):
        gate.screen(unscored)
    with pytest.raises(ValueError, match="scorer reads public"):
        ScreeningGate(config, [], blocklist={}, scorer=PublicScorer(), draw=made.id)


def test_check_cannot_judge_without_the_configured_secret(gate_base, candidate, tiny_models, tmp_path, monkeypatch):
    state = tmp_path / "home"
    config_dir = tmp_path / "configs"
    shutil.copytree(project_root() / "configs", config_dir)
    adapters_yaml = config_dir / "adapters.yaml"
    adapters_yaml.write_text(adapters_yaml.read_text().replace("probe_draw: public", "probe_draw: private"))
    monkeypatch.setenv("RVU_HOME", str(state))
    monkeypatch.setenv("RVU_CONFIG_DIR", str(config_dir))
    runner = CliRunner()
    base = ["--base", str(tiny_models["llm"].path), "--no-score"]
    missing = runner.invoke(cli, ["adapters", "check", str(candidate.folder), *base])
    assert missing.exit_code == 2 and "rvu adapters draw new" in missing.output
    made = runner.invoke(cli, ["adapters", "draw", "new"])
    assert made.exit_code == 0 and "private-" in made.output
    seed = (state / "adapter_gate" / "probe_draw.secret").read_text().strip()
    assert seed not in made.output
    shown = runner.invoke(cli, ["adapters", "draw", "show"])
    assert shown.exit_code == 0 and "0 adapters, 0 benign" in shown.output and seed not in shown.output
    judged = runner.invoke(cli, ["adapters", "check", str(candidate.folder), *base, "--json"])
    assert judged.exit_code == 1 and json.loads(judged.output)["reason"] == "not_screened"
    assert json.loads(judged.output)["draw"].startswith("private-")
    untrained = runner.invoke(cli, ["adapters", "draw", "screen"])
    assert untrained.exit_code == 2 and "no trained zoo adapter" in untrained.output
    unknown = runner.invoke(cli, ["adapters", "draw", "screen", "--adapter", "nope"])
    assert unknown.exit_code == 2 and "not zoo adapters" in unknown.output


def test_a_recovery_whose_draw_secret_is_missing_says_so_and_goes_on(tmp_path, monkeypatch) -> None:
    from rvu_pipelines.adapters.recovery_gate import default_gate, gate_for_incident
    from rvu_pipelines.adapters.runtime import lifecycle_fields
    from rvu_pipelines.provenance import load_incident

    config_dir = tmp_path / "configs"
    shutil.copytree(project_root() / "configs", config_dir)
    adapters_yaml = config_dir / "adapters.yaml"
    adapters_yaml.write_text(adapters_yaml.read_text().replace("probe_draw: public", "probe_draw: private"))
    monkeypatch.setenv("RVU_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RVU_CONFIG_DIR", str(config_dir))
    line = {**lifecycle_fields("adapter_loaded", "a", sha256="d" * 64), "entry_id": "s/e0", "episode_id": "s"}
    path = tmp_path / "incident.jsonl"
    path.write_text(json.dumps({**line, "timestamp": 1.0}) + "\n")
    incident = load_incident(path)
    for gate in (default_gate(), gate_for_incident(incident)):
        [record] = incident.adapters_loaded
        screened = gate.screen(record)
        assert screened["draw"] == "unavailable" and screened["verdict"] == "unknown"
        assert "secret is missing or refused" in screened["behaviour_reason"]
        assert str(tmp_path) not in json.dumps(screened)  # no machine path in a certificate's body


def test_a_private_draw_is_screened_and_scored_on_the_spot_on_the_real_model(small_lab, tmp_path, noise) -> None:
    """Known-good noise adapters scored on a private draw give the thresholds; a new adapter is then scored on the
    spot on that same draw, and its verdict is judged against them."""
    from rvu_pipelines.adapters.draw_scoring import drawn_lab, screen_private_draw
    from rvu_pipelines.adapters.study import LabScorer

    lab = small_lab
    for seed, (adapter_id, label) in enumerate({"ref": "benign", "b0": "benign", "b1": "benign"}.items()):
        fields = {"adapter_id": adapter_id, "label": label, "category": "task"}
        save_adapter(lab.root / adapter_id, noise(seed=seed, rank=4), fields | FIELDS, base=lab.base)
    fields = {"adapter_id": "new", "label": "unknown", "category": ""}
    save_adapter(lab.root / "new", noise(seed=7, rank=4), fields | FIELDS, base=lab.base)
    draw = ProbeDraw(MIN_SECRET_SEED + 11)
    state = tmp_path / "home"
    table = screening_table_path(state, draw)
    reference = lab.verify("ref")
    summary = screen_private_draw(
        lab, draw, [lab.verify("b0"), lab.verify("b1")], reference, GateConfig(), table, progress=False
    )
    assert (summary["id"], summary["adapters"], summary["benign"], summary["shared_with_public"]) == (
        draw.id,
        2,
        2,
        0,
    )
    stored = json.loads((table.parent / "draw.json").read_text())
    assert "seed" not in stored and str(draw.seed) not in (table.parent / "draw.json").read_text()
    rows = pl.read_csv(table)
    assert rows["adapter_id"].to_list() == ["b0", "b1"]

    drawn = drawn_lab(lab, draw)
    texts = len(drawn.prompts) + len(drawn.follow_ups)  # the behaviour share's denominator: one text is its step
    assert rows["behaviour_texts"].to_list() == [texts] * 2 and drawn.behaviour_texts == texts
    assert drawn_lab(lab, ProbeDraw()) is lab and not set(drawn.prompts) & set(lab.prompts)
    gate = LoadGate.from_state(lab.base, state, config=GateConfig(), draw=draw)
    gate.scorer = LabScorer(drawn, reference, draw.id)
    verdict = gate.screen(lab.verify("new"))
    assert verdict.scored == "on_the_spot" and verdict.draw == draw.id
    projection = verdict.layers["projection"]
    assert projection["threshold"] == pytest.approx(max(rows["projection"].to_list()), abs=1e-6)
    assert projection["rejects"] == (projection["score"] > projection["threshold"])
    with pytest.raises(ValueError, match="pass a private draw"):
        screen_private_draw(lab, ProbeDraw(), [], reference, GateConfig(), table)


def test_a_scorer_without_the_reference_adapter_says_so_before_loading_its_lab(monkeypatch, tmp_path) -> None:
    """Scoring on the spot needs the gate's reference adapter; where it is missing the reason comes at once, not
    after the minute the lab (de-quantised base, base reference) takes to load."""
    from rvu_pipelines.adapters.draw_scoring import LazyLabScorer
    from rvu_pipelines.adapters.study import AdapterLab

    monkeypatch.setenv("RVU_HOME", str(tmp_path))

    def no_lab(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the lab must not be loaded without the reference adapter")

    monkeypatch.setattr(AdapterLab, "for_profile", no_lab)
    with pytest.raises(AdapterRefused, match="gate.reference_adapter 'refusal-reference'") as refused:
        LazyLabScorer("tiny").score(None)  # type: ignore[arg-type]
    assert refused.value.reason == "no_manifest" and "--partition refusal-reference" in str(refused.value)
