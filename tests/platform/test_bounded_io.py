"""Files from outside are read only when they are regular files within the size limit, never hanging."""

from __future__ import annotations

import os

import pytest

from rvu_pipelines.bounded_io import read_input_file, truncate_for_message
from rvu_pipelines.errors import ConfigError, InputFileError
from rvu_pipelines.settings import max_input_bytes


def test_regular_file_is_read(tmp_path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    assert read_input_file(path, what="incident log") == b'{"a": 1}\n'


def test_device_fifo_folder_and_missing_are_refused(tmp_path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="FIFO"):
        read_input_file(fifo, what="incident log")  # would block forever if opened for reading normally
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputFileError, match="device"):
        read_input_file(link, what="certificate")
    with pytest.raises(InputFileError, match="folder"):
        read_input_file(tmp_path, what="certificate")
    with pytest.raises(InputFileError, match="no such file"):
        read_input_file(tmp_path / "absent.json", what="certificate")


def test_size_limit_names_the_variable_only_when_it_is_the_limit(tmp_path, monkeypatch) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"x" * 2048)
    with pytest.raises(InputFileError) as fixed:
        read_input_file(path, what="trust file", max_bytes=1024, limit_reason="it holds only fingerprints")
    message = str(fixed.value)
    assert "RVU_MAX_INPUT_MB" not in message
    assert "2.0 KiB is over the fixed 1.0 KiB limit for a trust file (it holds only fingerprints)" in message
    monkeypatch.setenv("RVU_MAX_INPUT_MB", "0.001")
    assert max_input_bytes() == int(0.001 * 2**20)
    with pytest.raises(InputFileError, match="raise RVU_MAX_INPUT_MB"):
        read_input_file(path, what="incident log")
    monkeypatch.setenv("RVU_MAX_INPUT_MB", "lots")
    with pytest.raises(ConfigError, match="RVU_MAX_INPUT_MB"):
        max_input_bytes()


def test_links_are_refused_unopened_when_not_to_be_followed(tmp_path) -> None:
    """A file that turned up in a watched folder is read only if it is a regular file there: a link to a
    readable file elsewhere (or to a FIFO, which would block) is refused at open, naming where it points."""
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(b"{}\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(elsewhere)
    assert read_input_file(link, what="incident log") == b"{}\n"  # a path the user named may be a link
    with pytest.raises(InputFileError, match="is a symbolic link") as refused:
        read_input_file(link, what="incident log", follow_links=False)
    assert str(elsewhere) in str(refused.value)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "to-fifo").symlink_to(fifo)
    with pytest.raises(InputFileError, match="is a symbolic link"):
        read_input_file(tmp_path / "to-fifo", what="incident log", follow_links=False)
    assert read_input_file(elsewhere, what="incident log", follow_links=False) == b"{}\n"


def test_long_values_are_cut_in_messages() -> None:
    text = truncate_for_message("x" * 10_000, limit=50)
    assert len(text) < 80 and "10002 characters" in text
    assert truncate_for_message("short") == "'short'"
