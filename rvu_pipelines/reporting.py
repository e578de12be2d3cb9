"""Small renderers for results people read: markdown tables for asset metadata, notes and the README."""

from __future__ import annotations

import polars as pl


def _cell(value: object, width: int) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, (list, tuple)):
        text = ", ".join(str(v) for v in value)
    else:
        text = "" if value is None else str(value)
    text = text.replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def markdown_table(frame: pl.DataFrame, *, max_rows: int = 20, max_width: int = 60) -> str:
    """The first ``max_rows`` rows as a GitHub-flavoured markdown table, long cells clipped."""
    head = frame.head(max_rows)
    lines = ["| " + " | ".join(head.columns) + " |", "|" + "---|" * len(head.columns)]
    lines += ["| " + " | ".join(_cell(v, max_width) for v in row) + " |" for row in head.iter_rows()]
    if frame.height > max_rows:
        lines.append(f"\n({frame.height - max_rows} more rows)")
    return "\n".join(lines)
