"""The product speaks of the product: no internal ticket numbers or numbered work periods in code, configs or docs.

Code, comments, docstrings, string literals, YAML configs, the Makefile, the CI scripts, README and the docs
site state the present design and why; a decision's reason stays, its ticket number does not. A number that
names an upstream project's bug (a llama.cpp or Dagster issue, a GitHub link) is a reference, not history, and
is allowed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Checked elsewhere, so left out here (path or folder prefix -> why).
EXCLUDED: dict[str, str] = {}
PROSE = ("README.md", "CHANGELOG.md")  # and every Markdown page of the docs site
SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".sh")
NAMES = ("Makefile", "Dockerfile")
FOLDERS = (".ci/",)

# Built from pieces so that this file's own text never matches what it looks for.
_WORDS = "|".join(("iss" + "ue", "tic" + "ket", "sess" + "ion", "work " + "period"))
_TICKET = rf"(?i:(?<![-_./])\b(?:{_WORDS})s? ?#?\d+)"  # a ticket or a numbered work period
_PULL = r"\b" + "P" + r"R ?#?\d+"  # a pull request
_BARE = r"\(#" + r"\d+\)"  # a bare tracker reference in parentheses
HISTORY = re.compile("|".join((_TICKET, _PULL, _BARE)))

# A number preceded (on its line, within this many characters) by an upstream project's name is its bug.
UPSTREAM_WINDOW = 40
UPSTREAM = re.compile(
    r"(?i)\b(?:llama\.cpp|llama-cpp-python|dagster|mlflow|peft|transformers|agentdojo|pytorch|torch|duckdb|faiss|"
    r"safetensors|onnx(?:runtime)?|huggingface|polars|numpy|scikit-learn|sklearn|celery|postgres(?:ql)?)\b"
    r"|github\.com/"
)


def _tracked() -> list[str]:
    try:
        done = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60, text=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"not a git checkout, so no list of tracked files: {exc}")
    return [path for path in done.stdout.split("\0") if path]


def _scanned(path: str) -> bool:
    if any(path == rule or (rule.endswith("/") and path.startswith(rule)) for rule in EXCLUDED):
        return False
    prose = path in PROSE or (path.startswith("docs/") and path.endswith(".md"))
    return prose or path.endswith(SUFFIXES) or path.rsplit("/", 1)[-1] in NAMES or path.startswith(FOLDERS)


def _upstream(line: str, start: int) -> bool:
    return UPSTREAM.search(line[max(0, start - UPSTREAM_WINDOW) : start]) is not None


def history_hits(text: str) -> list[tuple[int, str]]:
    """(line number, matched text) of every internal ticket or work-period reference in ``text``."""
    hits = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in HISTORY.finditer(line):
            if not _upstream(line, match.start()):
                hits.append((number, match.group(0)))
    return hits


def test_the_pattern_catches_tickets_and_work_periods_and_allows_upstream_bugs() -> None:
    ticket, period = "iss" + "ue 17", "sess" + "ion 30"
    assert history_hits(f"x = 1  # {ticket}: the goal\n# done in {period}") == [(1, ticket), (2, period)]
    assert history_hits("see (#" + "12)") == [(1, "(#" + "12)")]
    assert history_hits("merged in P" + "R 12") == [(1, "P" + "R 12")]
    assert history_hits(f"segfaults (llama.cpp {ticket}), so") == []
    assert history_hits(f"locks under parallel steps (dagster {ticket}; the answer is Postgres)") == []
    assert history_hits("scripts/run.py --sess" + "ions 4 --episodes 3") == []


def test_no_internal_ticket_or_work_period_in_code_configs_or_docs() -> None:
    paths = [path for path in _tracked() if _scanned(path)]
    assert any(path.endswith(".py") for path in paths) and "Makefile" in paths and "README.md" in paths
    found: list[str] = []
    for path in paths:
        file = REPO / path
        if not file.is_file():  # deleted in the work tree, not yet in the index
            continue
        text = file.read_text(encoding="utf-8", errors="replace")
        found.extend(f"{path}:{number}: {hit}" for number, hit in history_hits(text))
    assert not found, (
        "internal ticket numbers or work periods in code, configs or docs; state the design and its reason "
        "instead:\n" + "\n".join(found)
    )
