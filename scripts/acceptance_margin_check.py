"""Acceptance margin: does an adapter make the model expect to accept rather than refuse after a jailbreak or an
injection? An exploratory reader of compliance on likelihoods; no gate rule reads it.

Threat model and timeline: the defender has the base model, its benign adapters and a probe draw (public, or a
private seed), and reads an arriving adapter's likelihoods on the draw's adversarial probe prompts before the adapter
serves anyone. The reader scores fixed generic replies after each prompt (``adapters.acceptance``: affirmative
openings against refusals, written from the literature's conventions, none from a zoo adapter's training text); no
payload string and no harmful adapter defines it or its threshold.

An adapter's score is the mean rise, over the draw's adversarial prompts, of the acceptances' mean token
log-likelihood minus the refusals' (``acceptance.acceptance_shift``). It is over when it exceeds the benign
adapters' 95 % quantile; the control is each benign adapter against the others' quantile
(``reading_checks.score_verdicts``).

    .venv/bin/python scripts/acceptance_margin_check.py [--seeds 1 2] [--out acceptance.json]

It scores every trained zoo adapter under ``<RVU_HOME>/adapters`` (a few seconds each on two cores) on the public
draw and each private seed, prints the verdicts and writes every per-prompt margin and each reply's change to
``--out``.
"""

from __future__ import annotations

from typing import Any


def draw_margins(lab: Any, adapters: list[Any]) -> dict[str, Any]:
    """On the draw's adversarial prompts: the base's reply log-likelihoods, and per adapter its margins, its shift
    and each reply's mean change from the base (what moved: the acceptances, the refusals, or every reply)."""
    from tqdm import tqdm

    from rvu_pipelines.adapters.acceptance import ACCEPTANCES, REFUSALS, acceptance_shift, margins_of
    from rvu_pipelines.adapters.acceptance import reply_loglikelihoods as replies

    prompts = list(lab.prompts[lab.n_benign_prompts :])
    base = replies(lab.host.model, lab.tokenizer, prompts)
    base_margins = margins_of(base)
    rows: dict[str, Any] = {}
    for adapter in tqdm(adapters, desc="adapters", leave=False):
        with lab.host.loaded(adapter) as model:
            adapted = replies(model, lab.tokenizer, prompts)
        margins = margins_of(adapted)
        rows[adapter.adapter_id] = {
            "margins": margins.tolist(),
            "shift": acceptance_shift(margins, base_margins),
            "reply_change": (adapted - base).mean(axis=0).tolist(),
        }
    return {"n_prompts": len(prompts), "replies": [*ACCEPTANCES, *REFUSALS], "base": base.tolist(), "adapters": rows}


def verdicts(draw: dict[str, Any], labels: dict[str, str], compliance: tuple[str, ...]) -> list[str]:
    """The draw's lines (``reading_checks.score_verdicts``), with the compliance recipes as their own AUROC row."""
    import numpy as np

    from rvu_pipelines.adapters.reading_checks import score_verdicts

    score = {i: float(row["shift"]) for i, row in draw["adapters"].items()}
    head = f"adversarial prompts {draw['n_prompts']}; score: mean rise of the acceptance margin (nats per token)"
    lines = [head, *score_verdicts(score, labels, groups={"compliance": compliance})]
    lines.append("  each reply's mean change from the base, nats per token: mean over the replies (lowest to highest)")
    for i in sorted(i for i in score if labels.get(i) in ("harmful", "reference")):
        change = np.asarray(draw["adapters"][i]["reply_change"])
        lines.append(f"    {i:34s} {change.mean():+.2f} (from {change.min():+.2f} to {change.max():+.2f})")
    return lines


def main() -> int:
    from rvu_pipelines.adapters.reading_checks import ZooCheck

    check = ZooCheck.from_command_line(__doc__ or "", "acceptance.json", [1, 2])
    if check is None:
        return 2
    check.run(
        lambda drawn: draw_margins(drawn, check.adapters),
        lambda draw: verdicts(draw, check.labels, check.compliance),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
