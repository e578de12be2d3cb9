"""README's layout matches the tree (how modules meet is tested in test_private_names and test_import_graph)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _layout_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Layout", 1)[1]
    return section.split("```", 2)[1]


def test_readme_layout_names_every_package_and_only_paths_that_exist() -> None:
    block = _layout_block()
    named = set()
    parent = ""
    for line in block.splitlines():
        match = re.match(r"^(\s*)(\S+)", line)
        if not match or not re.search(r"[/.]", match.group(2)):
            continue
        token = match.group(2)
        if not match.group(1):  # top level: a folder of the checkout or a path from it
            parent = token if token.endswith("/") else ""
            named.add(token.rstrip("/"))
        elif len(match.group(1)) == 2 and parent:  # one level into the folder above
            named.add(parent + token.rstrip("/"))
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert missing == [], f"README's layout names paths that do not exist: {missing}"
    packages = {
        f"rvu_pipelines/{p.name}"
        for p in (REPO / "rvu_pipelines").iterdir()
        if p.is_dir() and (p / "__init__.py").exists()
    }
    assert packages - named == set(), f"packages missing from README's layout: {sorted(packages - named)}"
