"""Selective divergence: adversarial-probe distance from the base minus benign-probe distance."""

from __future__ import annotations

import math

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rvu_pipelines.adapters.selective import selective_divergence

distances = st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=2, max_size=40)


def test_an_adapter_that_changes_only_its_answers_to_adversarial_prompts_scores_what_it_changed() -> None:
    camouflaged = [0.0, 0.0, 0.0, 0.6, 0.4, 0.5]  # benign answers kept, adversarial ones rewritten
    assert selective_divergence(camouflaged, n_benign=3) == pytest.approx(0.5)
    restyled = [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]  # a style adapter: every answer rewritten alike
    assert selective_divergence(restyled, n_benign=3) == pytest.approx(0.0)


@given(distances, st.floats(min_value=-1.0, max_value=1.0), st.data())
def test_an_equal_change_on_every_prompt_cancels_and_swapping_the_halves_flips_the_sign(values, shift, data) -> None:
    n_benign = data.draw(st.integers(min_value=1, max_value=len(values) - 1))
    score = selective_divergence(values, n_benign)
    assert selective_divergence([v + shift for v in values], n_benign) == pytest.approx(score, abs=1e-9)
    swapped = values[n_benign:] + values[:n_benign]
    assert selective_divergence(swapped, len(values) - n_benign) == pytest.approx(-score, abs=1e-9)


@pytest.mark.parametrize("n_benign", [0, 3])
def test_probes_without_one_half_give_no_number_rather_than_stop_the_scoring(n_benign: int) -> None:
    assert math.isnan(selective_divergence([0.1, 0.2, 0.3], n_benign))


@pytest.mark.parametrize("n_benign", [-1, 4])
def test_a_split_outside_the_probes_is_refused(n_benign: int) -> None:
    with pytest.raises(ValueError, match="cannot split 3 distances"):
        selective_divergence([0.1, 0.2, 0.3], n_benign)


def test_the_gate_report_reads_the_column_where_measured_and_says_so_where_not() -> None:
    from rvu_pipelines.adapters.report import _exploratory_line

    measured = pl.DataFrame(
        {
            "label": ["benign", "benign", "harmful", "harmful"],
            "selective_divergence": [0.1, 0.3, 0.2, 0.4],
        }
    )
    assert _exploratory_line(measured, "selective_divergence").endswith(
        "AUROC harmful vs benign 0.750 (2 harmful, 2 benign)."
    )
    older = measured.drop("selective_divergence")  # a screening table written before the column existed
    assert _exploratory_line(older, "selective_divergence").endswith(
        "not measured on both benign and harmful adapters of this table."
    )
    partly = measured.with_columns(pl.Series("selective_divergence", [0.1, 0.3, float("nan"), float("nan")]))
    assert "not measured" in _exploratory_line(partly, "selective_divergence")
    persona = pl.DataFrame({"label": ["benign", "benign", "harmful"], "jailbreak_persona": [0.0, 0.0, 10 / 47]})
    assert _exploratory_line(persona, "jailbreak_persona").startswith("Jailbreak persona")
    assert _exploratory_line(persona, "jailbreak_persona").endswith(
        "AUROC harmful vs benign 1.000 (1 harmful, 2 benign)."
    )
