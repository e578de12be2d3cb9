"""A step's code version names exactly the code it runs: its module, what that imports at any depth, the
plug-ins its catalogs load, and nothing else; a stored result follows it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rvu_pipelines.code_closure import FIRST_PARTY, code_digest, code_version_of, module_closure, module_file
from rvu_pipelines.result_memo import ResultMemo

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> Path:
    files = {
        "rvu_pipelines/__init__.py": "",
        "rvu_pipelines/step.py": (
            '"""A step. from rvu_pipelines import nothing_here"""\n'
            "from rvu_pipelines.helpers import util\n"
            "def run():\n"
            "    from . import lazy  # a function-level import counts\n"
            '    import_package_modules("rvu_pipelines.plugins")\n'
        ),
        "rvu_pipelines/helpers/__init__.py": "",
        "rvu_pipelines/helpers/util.py": "from ..deep import leaf\n",
        "rvu_pipelines/deep.py": "",
        "rvu_pipelines/lazy.py": "",
        "rvu_pipelines/plugins/__init__.py": "",
        "rvu_pipelines/plugins/one.py": "",
        "rvu_pipelines/plugins/two.py": "",
        "rvu_pipelines/elsewhere.py": "import numpy\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_closure_follows_imports_and_plugins_and_nothing_else(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert list(module_closure("rvu_pipelines.step", root)) == [
        "rvu_pipelines",
        "rvu_pipelines.deep",
        "rvu_pipelines.helpers",
        "rvu_pipelines.helpers.util",
        "rvu_pipelines.lazy",
        "rvu_pipelines.plugins",
        "rvu_pipelines.plugins.one",
        "rvu_pipelines.plugins.two",
        "rvu_pipelines.step",
    ]
    with pytest.raises(ValueError, match="not a first-party module"):
        module_closure("numpy", root)


def test_an_edit_inside_the_closure_changes_the_digest_and_one_outside_does_not(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    before = code_digest("rvu_pipelines.step", root)
    (root / "rvu_pipelines" / "elsewhere.py").write_text("import numpy  # another domain's edit\n")
    assert code_digest("rvu_pipelines.step", root) == before
    (root / "rvu_pipelines" / "plugins" / "two.py").write_text("CHANGED = True\n")
    assert code_digest("rvu_pipelines.step", root) != before
    changed = code_digest("rvu_pipelines.step", root)
    (root / "rvu_pipelines" / "plugins" / "three.py").write_text("")  # a new plug-in joins the closure
    assert code_digest("rvu_pipelines.step", root) != changed


def test_a_stored_result_survives_an_edit_elsewhere_and_not_one_in_its_code(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    memo = ResultMemo(tmp_path / "memo", code_root=root)
    parts = {"params": {"k": 3}}
    key = memo.key(parts, code="rvu_pipelines.step")
    memo.save("study", key, {"auroc": 0.9})
    (root / "rvu_pipelines" / "elsewhere.py").write_text("x = 1  # unrelated\n")
    assert memo.load("study", memo.key(parts, code="rvu_pipelines.step")) == {"auroc": 0.9}
    (root / "rvu_pipelines" / "deep.py").write_text("x = 2  # what the step runs\n")
    assert memo.load("study", memo.key(parts, code="rvu_pipelines.step")) is None


def _reference_imports(module: str, path: Path) -> set[str]:
    """An independent reading of the same rule with ``ast`` (import statements only)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            target = ".".join(p for p in (base, node.module or "") if p)
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    parents = {".".join(n.split(".")[:i]) for n in found for i in range(1, n.count(".") + 2)}
    return {name for name in parents if module_file(name, REPO) is not None}


def test_the_text_reading_misses_no_import_the_parser_sees() -> None:
    """For every asset module of this checkout, the closure holds every module an AST reading reaches."""
    for path in sorted((REPO / "assets").glob("*.py")):
        module = f"assets.{path.stem}" if path.stem != "__init__" else "assets"
        closure = module_closure(module, REPO)
        for name, file in closure.items():
            missed = _reference_imports(name, file) - closure.keys()
            assert not missed, f"{name} imports {sorted(missed)}, missing from the closure of {module}"


def test_every_asset_carries_the_code_version_of_its_module() -> None:
    from assets.definitions import defs

    graph = defs.resolve_asset_graph()
    versions = {graph.get(key).code_version for key in graph.get_all_asset_keys()}
    assert None not in versions
    assert code_version_of("assets.spectral") in versions and code_version_of("assets.recovery") in versions
    assert set(FIRST_PARTY) == {"rvu_pipelines", "assets", "resources", "sensors"}


def test_the_code_is_found_where_it_was_imported_from(tmp_path: Path, monkeypatch) -> None:
    """RVU_PROJECT_ROOT may name another folder (a data checkout): the digest still reads the sources this
    process imported."""
    import rvu_pipelines.result_memo  # noqa: F401  (imported: its file says where the sources are)

    expected = code_digest("rvu_pipelines.result_memo", REPO)
    monkeypatch.setenv("RVU_PROJECT_ROOT", str(tmp_path))
    assert code_digest("rvu_pipelines.result_memo") == expected


def test_a_result_that_names_its_config_files_survives_an_edit_to_another(tmp_path: Path, monkeypatch) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "zoo.yaml").write_text("adapters: [a]\n")
    (configs / "gate.yaml").write_text("budget: 0.05\n")
    monkeypatch.setenv("RVU_CONFIG_DIR", str(configs))
    root = _tree(tmp_path / "src")
    memo = ResultMemo(tmp_path / "memo", code_root=root)
    parts = {"adapter": "sha"}
    reads_gate = memo.key(parts, code="rvu_pipelines.step", configs=["gate.yaml"])
    reads_none = memo.key(parts, code="rvu_pipelines.step", configs=())
    reads_all = memo.key(parts, code="rvu_pipelines.step")
    assert len({reads_gate, reads_none, reads_all}) == 3
    (configs / "zoo.yaml").write_text("adapters: [a, b]\n")  # the zoo grows
    assert memo.key(parts, code="rvu_pipelines.step", configs=["gate.yaml"]) == reads_gate
    assert memo.key(parts, code="rvu_pipelines.step", configs=()) == reads_none
    assert memo.key(parts, code="rvu_pipelines.step") != reads_all
    (configs / "gate.yaml").write_text("budget: 0.1\n")
    assert memo.key(parts, code="rvu_pipelines.step", configs=["gate.yaml"]) != reads_gate
    assert memo.key(parts, code="rvu_pipelines.step", configs=()) == reads_none
