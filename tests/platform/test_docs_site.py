"""The documentation site stays true to the code and builds: the generated reference pages equal a fresh render,
every page in the navigation exists, the hand-written references name every field the code defines, and
``mkdocs build --strict`` passes (a broken link, anchor or snippet fails it)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# Pages other pages and README link to by path; moving one breaks their links.
LINKED_PAGES = (
    "index.md",
    "getting-started.md",
    "concepts.md",
    "guides/dagster-ui.md",
    "guides/nightly-regression.md",
    "guides/incident-recovery.md",
    "guides/adapter-gate.md",
    "guides/mlflow.md",
    "guides/scale-profile.md",
    "research/index.md",
    "research/seed-000.md",
    "research/seed-002.md",
    "research/seed-003.md",
    "research/seed-004.md",
    "reference/cli.md",
    "reference/settings.md",
    "reference/incident-log.md",
    "reference/certificate.md",
    "contributing.md",
    "development.md",
)


def _reference_script() -> ModuleType:
    """scripts/ is a folder of scripts, not a package: load the generator by path."""
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _ConfigLoader(yaml.SafeLoader):
    """mkdocs.yml with MkDocs' own tags (``!relative``, ``!ENV``) read as plain values."""


_ConfigLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _nav_pages(nav: Any) -> list[str]:
    """Every page path in a MkDocs ``nav`` (entries: "path", {"title": "path"} or {"title": [...]})."""
    if isinstance(nav, str):
        return [] if "://" in nav else [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    return []


def test_generated_reference_pages_equal_a_fresh_render() -> None:
    script = _reference_script()
    pages = script.render_pages()
    assert set(pages) == {DOCS / "reference" / "cli.md", DOCS / "reference" / "settings.md"}
    assert pages == script.render_pages(), "the generator must be deterministic"
    stale = [str(path.relative_to(REPO)) for path in script.stale_pages(pages)]
    assert not stale, f"generated pages are stale: {stale}; run `.venv/bin/python scripts/docs_reference.py`"


def test_the_cli_page_covers_every_command_and_option() -> None:
    import click

    from rvu_pipelines.cli import cli

    text = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    script = _reference_script()
    for command, ctx in script.walk_commands(cli, click.Context(cli, info_name="rvu")):
        if ctx.parent is not None:
            assert f"\n{'#' * len(ctx.command_path.split())} {ctx.command_path}\n" in text, ctx.command_path
        for param in command.get_params(ctx):
            if isinstance(param, click.Option) and param is not command.get_help_option(ctx):
                assert all(name in text for name in param.opts), (ctx.command_path, param.opts)


def test_markdown_text_escapes_prose_and_keeps_code_spans() -> None:
    escape = _reference_script().markdown_text
    assert escape("registered:<name>[@<alias>]") == r"registered:&lt;name&gt;\[@&lt;alias&gt;\]"
    assert escape("run `rvu recover <file>` then *verify*") == r"run `rvu recover <file>` then \*verify\*"
    assert escape("one ` backtick") == r"one \` backtick"


def test_every_page_in_the_navigation_exists() -> None:
    config = yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_ConfigLoader)
    pages = _nav_pages(config["nav"])
    assert len(pages) == len(set(pages)), "a page is listed twice in the navigation"
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"pages in mkdocs.yml's nav that do not exist under docs/: {missing}"
    unlisted = [page for page in LINKED_PAGES if page not in pages]
    assert not unlisted, f"pages other pages link to are missing from the navigation: {unlisted}"


def test_the_incident_log_page_names_every_schema_field() -> None:
    schema = json.loads((REPO / "configs" / "schemas" / "incident_log.schema.json").read_text(encoding="utf-8"))
    fields = {"kind"} | {name for branch in schema["allOf"] for name in branch["then"]["properties"]}
    kinds = set(schema["properties"]["kind"]["enum"])
    text = (DOCS / "reference" / "incident-log.md").read_text(encoding="utf-8")
    unnamed = sorted(name for name in fields | kinds if f"`{name}`" not in text)
    assert not unnamed, f"docs/reference/incident-log.md does not describe: {unnamed}"


def test_the_certificate_page_names_every_required_field() -> None:
    from rvu_pipelines.recovery.certificate import BODY_KEYS, CERTIFICATE_VERSION, REQUIRED_FIELDS

    text = (DOCS / "reference" / "certificate.md").read_text(encoding="utf-8")
    names = {*BODY_KEYS, "manifest_digest", "signature"} | {f for fields in REQUIRED_FIELDS.values() for f in fields}
    unnamed = sorted(name for name in names if f"`{name}`" not in text)
    assert not unnamed, f"docs/reference/certificate.md does not describe: {unnamed}"
    assert f"the format version, `{CERTIFICATE_VERSION}`" in text


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed in this environment; `make setup` installs it (the `docs` extra)")
    site = tmp_path / "site"
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{(done.stdout + done.stderr)[-4000:]}"
    for page in ("index.html", "reference/cli/index.html", "reference/incident-log/index.html"):
        assert (site / page).is_file(), page


def test_readme_stays_a_front_page() -> None:
    """README is what the platform is, the two commands, the headline results: the rest lives in the docs site."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert "make run" in readme and "make test" in readme
    for figure in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme):
        assert (REPO / figure).is_file(), f"README shows {figure}, which does not exist"


def test_the_dagster_ui_guide_lists_every_job() -> None:
    """A job a make target launches is where a user looks for it: the guide's job table names each one."""
    from assets.definitions import defs

    text = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "dagster-ui.md").read_text(encoding="utf-8")
    jobs = sorted(j.name for j in defs.resolve_all_job_defs() if not j.name.startswith("__"))
    assert len(jobs) >= 10
    assert [j for j in jobs if f"| `{j}` |" not in text] == []
