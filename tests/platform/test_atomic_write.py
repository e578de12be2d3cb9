"""Atomic writes never write through a link planted beside or at the target, and a failure leaves the old file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rvu_pipelines.atomic_write import atomic_path, atomic_writer, write_atomically


def leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name.endswith(".tmp"))


def test_writes_bytes_and_text_and_leaves_no_temp(tmp_path: Path) -> None:
    assert write_atomically(tmp_path / "a.bin", b"\x00\x01") == tmp_path / "a.bin"
    write_atomically(tmp_path / "sub" / "b.txt", "é\n")
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "sub" / "b.txt").read_bytes() == "é\n".encode()
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "sub") == []


def test_a_planted_predictable_temp_link_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("cert.json.tmp", ".cert.json.tmp", "cert.json.partial"):
        (out / name).symlink_to(victim)
    write_atomically(out / "cert.json", b"{}\n")
    assert victim.read_text() == "precious\n"
    assert not (out / "cert.json").is_symlink() and (out / "cert.json").read_bytes() == b"{}\n"


@pytest.mark.parametrize("writer", ["write_atomically", "atomic_writer", "atomic_path"])
def test_a_link_at_the_target_is_replaced_not_followed(tmp_path: Path, writer: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "out.json"
    target.symlink_to(victim)
    if writer == "write_atomically":
        write_atomically(target, b"new\n")
    elif writer == "atomic_writer":
        with atomic_writer(target) as handle:
            handle.write(b"new\n")
    else:
        with atomic_path(target) as temp:
            temp.write_bytes(b"new\n")
    assert victim.read_text() == "precious\n"
    assert stat.S_ISREG(os.lstat(target).st_mode) and target.read_bytes() == b"new\n"
    assert leftovers(tmp_path) == []


def test_a_failure_midway_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "table.parquet"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_writer(target) as handle:
        handle.write(b"half of the new")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError), atomic_path(target) as temp:
        temp.write_bytes(b"half of the new")
        raise RuntimeError("writer crashed")
    assert target.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_a_writer_that_leaves_a_link_at_the_temp_name_publishes_nothing(tmp_path: Path) -> None:
    """What the writer left under the temp name is reopened without following links before it is published."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "index.faiss"
    target.write_bytes(b"old")
    with pytest.raises(OSError), atomic_path(target) as temp:
        temp.unlink()
        temp.symlink_to(victim)
    assert target.read_bytes() == b"old" and victim.read_text() == "precious\n" and leftovers(tmp_path) == []


def test_modes_follow_the_umask_and_none_keeps_the_file_private(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        write_atomically(tmp_path / "private-by-umask", b"x")
    finally:
        os.umask(previous)
    os.umask(0o022)
    try:
        write_atomically(tmp_path / "shared", b"x")
        write_atomically(tmp_path / "secret", b"x", mode=None)
        with atomic_path(tmp_path / "table", mode=0o640) as temp:
            temp.write_bytes(b"x")
    finally:
        os.umask(previous)

    def mode(name: str) -> int:
        return stat.S_IMODE((tmp_path / name).stat().st_mode)

    assert (mode("private-by-umask"), mode("shared"), mode("secret"), mode("table")) == (0o600, 0o644, 0o600, 0o640)


def test_a_long_target_name_still_gets_a_temp_file(tmp_path: Path) -> None:
    name = "x" * 250 + ".json"
    write_atomically(tmp_path / name, b"{}")
    assert (tmp_path / name).read_bytes() == b"{}" and leftovers(tmp_path) == []
