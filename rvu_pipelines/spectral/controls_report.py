"""The controlled spectral study's report as Markdown, rendered from its JSON alone (so a report can be
regenerated from a kept ``controls.json`` without the model)."""

from __future__ import annotations

from typing import Any


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment over a family of p-values (keys kept)."""
    ordered = sorted(p_values.items(), key=lambda item: (item[1], item[0]))
    adjusted, running = {}, 0.0
    for rank, (key, p) in enumerate(ordered):
        running = max(running, min(1.0, (len(ordered) - rank) * p))
        adjusted[key] = running
    return adjusted


def _estimate(value: dict[str, Any] | None, digits: int = 3) -> str:
    if not value:
        return "–"
    return f"{value['value']:.{digits}f} [{value['low']:.2f}, {value['high']:.2f}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _switch_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in report["switch"]:
        s = r["switch"]
        p = f"{r['holm_p']:.2g}" if r.get("holm_p") is not None else "–"
        rates = f"{r['tpr']:.2f} / {r['fpr']:.2f}" if r["tpr"] is not None and r["fpr"] is not None else "–"
        rows.append(
            [
                r["set"],
                r["graph"],
                str(r["n_heldout"]),
                f"L{s['layer']} {s['statistic']}",
                _estimate(r["raw"]),
                _estimate(r["beyond_length"]),
                _estimate(r["length_only"]),
                _estimate(r.get("padded")),
                p,
                rates,
            ]
        )
    return rows


def _best_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for b in report["best_feature"]:
        padded = f"{b['padded']:.3f}" if b.get("padded") is not None else "–"
        beyond = f"{b['beyond_length']:.3f} [{b['beyond_length_low']:.2f}, {b['beyond_length_high']:.2f}]"
        rows.append(
            [
                b["set"],
                b["graph"],
                f"L{b['layer']} {b['statistic']}",
                f"{b['calibration_auroc']:.3f}",
                f"{b['raw']:.3f}",
                beyond,
                padded,
                f"{b['top_beyond_length']:.3f}",
            ]
        )
    return rows


def _lodo_vs(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in report["probe_lodo"]:
        candidates = [d for d in report["detectors"] if d["set"] == r["source"]]
        if not candidates:
            continue
        best = max(candidates, key=lambda d: d["raw"]["value"])
        meets = "yes" if r["auroc_value"] >= best["raw"]["value"] else "no"
        rows.append([r["source"], f"{r['auroc_value']:.3f}", _estimate(best["raw"]), best["detector"], meets])
    return rows


def render_controls(report: dict[str, Any]) -> str:
    """Markdown: the stamp, the switch under its controls, the defender's best feature, Attention Tracker,
    the probe's leave-one-set-out."""
    tracker = report["tracker"]
    lines = [
        report.get("stamp_line", ""),
        "",
        f"Attention Tracker: k = {tracker['k']} ({tracker['heads']} heads), chosen on 30 synthetic pairs.",
        "",
        "#### The calibrated switch under its controls (held out; intervals resample pairs)",
        "",
    ]
    lines += _table(
        [
            "set",
            "graph",
            "n held-out",
            "switch",
            "raw AUROC",
            "beyond length",
            "length alone (longer = injected)",
            "vs length-matched clean",
            "paired p (Holm)",
            "TPR / FPR",
        ],
        _switch_rows(report),
    )
    lines += ["", "#### The feature a defender would pick (highest calibration AUROC), held out", ""]
    lines += _table(
        [
            "set",
            "graph",
            "feature",
            "calibration AUROC",
            "held-out raw",
            "beyond length",
            "vs length-matched clean",
            "best beyond-length of all 120 (optimistic)",
        ],
        _best_rows(report),
    )
    lines += ["", "#### Attention Tracker (normalised focus, k swept on synthetic pairs), same controls", ""]
    lines += _table(
        ["set", "raw AUROC", "beyond length", "length alone", "vs length-matched clean"],
        [
            [
                r["set"],
                _estimate(r["raw"]),
                _estimate(r["beyond_length"]),
                _estimate(r["length_only"]),
                _estimate(r.get("padded")),
            ]  # fmt: skip
            for r in report["attention_tracker"]
        ],
    )
    if report.get("detectors"):
        lines += [
            "",
            "#### D1–D5 as shipped (text classifiers on the statement / document), same examples and controls",
            "",
        ]
        lines += _table(
            ["set", "detector", "n held-out", "raw AUROC", "beyond length", "vs length-matched clean", "paired p"],
            [
                [
                    r["set"],
                    r["detector"],
                    str(r["n_heldout"]),
                    _estimate(r["raw"]),
                    _estimate(r["beyond_length"]),
                    _estimate(r.get("padded")),
                    f"{r['paired_test']['p_value']:.2g}" if r.get("paired_test") else "–",
                ]  # fmt: skip
                for r in report["detectors"]
            ],
        )
    if report.get("probe_lodo"):
        lines += ["", "#### Logistic probe over per-head spectral and attention features, leave one set out", ""]
        lines += _table(
            ["held-out set", "AUROC [95% CI]", "n", "C (grouped CV on the other sets' calibration split)"],
            [
                [
                    r["source"],
                    f"{r['auroc_value']:.3f} [{r['auroc_low']:.2f}, {r['auroc_high']:.2f}]",
                    str(r["auroc_n"]),
                    f"{r['C']:.3g}",
                ]  # fmt: skip
                for r in report["probe_lodo"]
            ],
        )
        if report.get("detectors"):
            lines += ["", "#### The probe left out vs the best of D1–D5 on the same held-out examples", ""]
            lines += _table(
                ["held-out set", "probe (LODO)", "best of D1–D5", "which", "probe ≥ best"], _lodo_vs(report)
            )
    return "\n".join(lines) + "\n"
