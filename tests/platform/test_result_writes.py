"""Every file the library writes replaces its target in one step (``rvu_pipelines.atomic_write``): a run that
fails midway leaves the last results whole, and a link planted at a result's name is replaced, never written
through. The only in-place writes are into a folder this process made and publishes whole (a staging folder,
a private temporary folder), each marked ``# written in place: <why>`` on the line above."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import numpy as np
import pytest

from rvu_pipelines.atomic_write import write_stream_atomically
from rvu_pipelines.machine import write_stamp

LIBRARY = Path(__file__).resolve().parents[2] / "rvu_pipelines"
RECEIVER_WRITES = {"write_text", "write_bytes"}  # path.write_text(...)
TARGET_ARGUMENT_WRITES = {  # writer(..., target, ...) / frame.writer(target): the target's position
    "write_parquet": 0,
    "write_csv": 0,
    "write_json": 0,
    "write_ndjson": 0,
    "savefig": 0,
    "savez": 0,
    "savez_compressed": 0,
    "save_file": 1,  # safetensors: save_file(tensors, filename)
}
ATOMIC_CONTEXTS = {"atomic_path", "atomic_writer"}
STREAM_WRITER = "write_stream_atomically"  # its writer's file object is the atomic temp file
IN_MEMORY = {"BytesIO", "StringIO"}
MARKER = "# written in place:"


def _callee(call: ast.Call) -> str | None:
    return getattr(call.func, "id", getattr(call.func, "attr", None))


def _atomic_names(tree: ast.AST) -> set[str]:
    """Names a write may target: bound by ``with atomic_path(...) as name`` / ``atomic_writer(...) as name``, the
    file object a ``write_stream_atomically`` writer receives, an in-memory buffer."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _callee(node) == STREAM_WRITER:
            names |= {arg.arg for lam in node.args if isinstance(lam, ast.Lambda) for arg in lam.args.args}
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _callee(node.value) in IN_MEMORY:
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and isinstance(item.optional_vars, ast.Name):
                    if _callee(call) in ATOMIC_CONTEXTS:
                        names.add(item.optional_vars.id)
    return names


def _is_atomic_target(expr: ast.expr, names: set[str]) -> bool:
    if isinstance(expr, ast.Call) and getattr(expr.func, "id", None) in {"Path", "str"} and expr.args:
        expr = expr.args[0]
    return isinstance(expr, ast.Name) and expr.id in names


def _writes_mode(call: ast.Call, position: int) -> bool:
    mode = call.args[position] if len(call.args) > position else None
    mode = next((k.value for k in call.keywords if k.arg == "mode"), mode)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "wx")


def in_place_writes(source: str) -> list[int]:
    """Line numbers of writes that truncate their target where it stands, unmarked."""
    tree = ast.parse(source)
    names = _atomic_names(tree)
    marked = {
        token.start[0] + 1
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT and token.string.startswith(MARKER)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in RECEIVER_WRITES and isinstance(func, ast.Attribute):
            bad = not _is_atomic_target(func.value, names)
        elif name in TARGET_ARGUMENT_WRITES and len(node.args) > TARGET_ARGUMENT_WRITES[name]:
            bad = not _is_atomic_target(node.args[TARGET_ARGUMENT_WRITES[name]], names)
        elif name == "open" and isinstance(func, ast.Name):
            bad = _writes_mode(node, 1)
        elif name == "open" and isinstance(func, ast.Attribute):
            bad = _writes_mode(node, 0)
        else:
            bad = False
        if bad and node.lineno not in marked:
            found.append(node.lineno)
    return sorted(found)


def test_the_library_writes_no_file_in_place() -> None:
    offenders = [
        f"{path.relative_to(LIBRARY)}:{line}"
        for path in sorted(LIBRARY.rglob("*.py"))
        for line in in_place_writes(path.read_text())
    ]
    assert offenders == [], (
        "writes that truncate their target where it stands (a failure midway loses the last results, a planted "
        f"link is written through); use rvu_pipelines.atomic_write: {offenders}"
    )


def test_the_check_sees_each_in_place_shape_and_lets_the_atomic_ones_pass() -> None:
    source = "\n".join(
        [
            "def f(path, frame, fig, np, state):",
            "    path.write_text('x')",  # 2
            "    frame.write_parquet(path / 'a.parquet')",  # 3
            "    fig.savefig(path, dpi=80)",  # 4
            "    np.savez_compressed(path, a=1)",  # 5
            "    save_file(state, str(path))",  # 6: safetensors' target is its second argument
            "    open(path, 'w')",  # 7
            "    path.open(mode='wb')",  # 8
            "    open(path)",  # read: fine
            "    path.open('ab')",  # an append-only log: fine
            "    with atomic_path(path) as temp:",
            "        save_file(state, str(temp))",  # the atomic shape: fine
            "    write_stream_atomically(path, lambda handle: fig.savefig(handle, format='png'))",  # fine
            "    buffer = io.BytesIO()",
            "    np.savez(buffer, a=1)",  # in memory: fine
            "    # written in place: a staging folder",
            "    path.write_bytes(b'')",  # marked: fine
            "    write_atomically(path, 'x')",
        ]
    )
    assert in_place_writes(source) == [2, 3, 4, 5, 6, 7, 8]


def test_a_results_stamp_replaces_a_link_planted_at_its_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    results = tmp_path / "results"
    results.mkdir()
    (results / "stamp.json").symlink_to(victim)
    stamp = write_stamp(results, command="rvu report")
    assert victim.read_text() == "keep me"
    assert not stamp.is_symlink() and '"command": "rvu report"' in stamp.read_text()


def test_a_figure_and_a_frame_are_published_whole(tmp_path: Path) -> None:
    """A figure and a frame handed a file object read back as written, and a writer that fails midway leaves the
    previous file as it was (a feature record's round trip is in the spectral tests)."""
    import polars as pl

    from rvu_pipelines.spectral.plots import roc_curves

    labels = np.array([0, 0, 1, 1])
    figure = roc_curves({"switch": (labels, np.array([0.1, 0.4, 0.35, 0.8]))}, tmp_path / "roc.png")
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    frame = pl.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    write_stream_atomically(tmp_path / "t.parquet", frame.write_parquet)
    assert pl.read_parquet(tmp_path / "t.parquet").equals(frame)

    def fails(handle) -> None:
        handle.write(b"half a table")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_stream_atomically(tmp_path / "t.parquet", fails)
    assert pl.read_parquet(tmp_path / "t.parquet").equals(frame)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["roc.png", "t.parquet"]
