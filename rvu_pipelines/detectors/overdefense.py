"""Over-defense set: benign texts that use prompt-injection trigger words in ordinary senses.

As NotInject (Li et al. 2025, InjecGuard): "ignore case when sorting", "can be overridden", "act as a
proxy" are benign (label 0) but hold words injection detectors key on. The test part measures how often
a detector flags benign text for a word; the training part gives hard negatives. Nothing like it is
mirrored and the build machines are offline, so it is built from text at hand:

* test: the Python documentation in ``pydoc_data.topics`` and the docstrings and comments of the
  standard library's .py files (PSF-2.0, the running interpreter's), plus mirror records no detector
  corpus trains on: WMDP cyber questions and answer choices, AgentPoison StrategyQA questions and
  term descriptions, TOFU questions/answers, MINJA shopping instructions (MIT, see SOURCES.md).
* train: docstrings of installed packages pinned in pyproject.toml (``PACKAGES``), read statically
  with :mod:`ast` (nothing is imported); tests, vendored code, transformers' per-model files
  (generated near-copies) and torch's private subpackages are skipped. A package's licence comes from
  its metadata (License-Expression, else License, else the classifier); one whose licence is not all
  ``PERMISSIVE`` contributes nothing. Texts follow the installed versions, which the manifest records.

A source goes whole to one side. Documentation is cut into paragraphs (reST markup, doctests, literal
blocks, code fences and parameter headers removed) and sentences; records are kept whole. A text is
kept when it is natural language (:func:`is_natural`), has a trigger as a whole word (``TRIGGER_FORMS``,
any case; the first match names its ``trigger``) and does not match ``INJECTION_LIKE`` (it tells a
model to drop its instructions, addresses a model, or is about prompt injection). "jailbreak" and
"previous/new instructions" are no triggers: benign uses are rare and too close to attacks.

:func:`leak_free` (Jaccard >= 0.5 on word 5-grams, :mod:`near_duplicates`) drops every text with an
exact or near twin among the texts the detector corpora are built from (all rows of deepset,
TrustAIRLab and awesome-chatgpt-prompts: a superset of each corpus's training and test split), and
every test text with a twin among the training candidates; each remaining exact or near-duplicate
cluster keeps its smallest id. At most ``DEFAULT_MAX_PER_TRIGGER[split]`` texts per (split, trigger)
are kept, round-robin over sources in a seeded hash order of ids, so no source fills a trigger. The
frame is sorted by (split, id); the same installed packages and mirror give the same frame.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.metadata as metadata
import inspect
import os
import re
import sys
import sysconfig
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import polars as pl

from rvu_pipelines.detectors.corpora import normalize_whitespace
from rvu_pipelines.detectors.near_duplicates import cluster_labels, near_duplicates
from rvu_pipelines.errors import DetectorError

SEED = 42
SPLITS = ("train", "test")
DEFAULT_MAX_PER_TRIGGER: dict[str, int] = {"test": 150, "train": 300}
COLUMNS = dict.fromkeys(("id", "text", "trigger", "source", "licence", "split"), pl.String) | {"label": pl.Int8}
_CORPUS_DATASETS = ("awesome_chatgpt_prompts", "deepset_prompt_injections", "trustair_jailbreaks")

TRIGGER_FORMS: dict[str, tuple[str, ...]] = {
    "ignore": ("ignore", "ignores", "ignored", "ignoring"),
    "forget": ("forget", "forgets", "forgot", "forgotten", "forgetting"),
    "disregard": ("disregard", "disregards", "disregarded", "disregarding"),
    "act as": ("act as", "acts as", "acted as", "acting as"),
    "pretend": ("pretend", "pretends", "pretended", "pretending"),
    "system prompt": ("system prompt", "system prompts"),
    "override": ("override", "overrides", "overrode", "overridden", "overriding"),
    "instruction": ("instruction", "instructions"),
    "developer mode": ("developer mode",),
    "bypass": ("bypass", "bypasses", "bypassed", "bypassing"),
}
TRIGGERS: tuple[str, ...] = tuple(TRIGGER_FORMS)
_FORM_TRIGGER = {form: trigger for trigger, forms in TRIGGER_FORMS.items() for form in forms}


def _forms_regex(forms: Iterable[str]) -> re.Pattern[str]:
    alternatives = sorted((r"\s+".join(map(re.escape, form.split())) for form in forms), key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(alternatives) + r")\b", re.IGNORECASE)


_TRIGGER_RE = _forms_regex(_FORM_TRIGGER)

# Texts that read as an injection themselves, address a model, or are about prompt injection.
INJECTION_LIKE = re.compile(
    "|".join(
        [
            r"\b(?:ignor|disregard|forget|forgot|overrid|bypass)\w*(?:\W+\w+){0,4}?\W+(?:previous|prior|above|preceding"
            r"|earlier|all|any|your|my|original|initial|system)\W+(?:instructions?|prompts?|directions?|rules"
            r"|guidelines|messages?|commands?|context)\b",
            r"\b(?:previous|prior|new|above|earlier|original|initial|hidden|secret)\s+(?:instructions?|prompts?)\b",
            r"\byou\s+are\s+now\b|\bdo\s+anything\s+now\b|\bfrom\s+now\s+on\b|\bjailbr[eo]ak|\bprompt\s+injections?\b",
            r"\bdeveloper\s+mode\s+(?:enabled|on)\b|\b(?:pretend|act\s+as\s+if)\s+(?:that\s+)?you\b",
            r"\bacts?\s+as\s+(?:an?\s+)?(?:ai|assistant|chatbot|language\s+model|unfiltered|uncensored|dan)\b",
            r"\bas\s+an?\s+(?:ai|language\s+model)\b|\bno\s+(?:restrictions|filters|censorship)\b",
            r"\byou\s+are\s+(?:an?\s+)?(?:helpful|expert|impartial|ai|assistant|chatbot|language\s+model)\b",
            r"\b(?:reveal|print|repeat|leak|show|output)\s+(?:your|the)\s+(?:system\s+prompt|instructions|hidden)",
        ]
    ),
    re.IGNORECASE,
)

_PLAIN_WORD = re.compile(r"^[\"'(\[]?[A-Za-z][A-Za-z'’-]*[\"')\].,;:!?]*$")
_CODE_SYMBOLS = set("{}[]<>=_\\|#@$%^&*~`/")
_URL = re.compile(r"://|\bwww\.|\.(?:com|org|io|html)\b", re.IGNORECASE)
_UNDERLINE = re.compile(r"^([-=~^*#+\"'`])\1{2,}$")
_PARAM_HEADER = re.compile(r"^\*{0,2}[A-Za-z_][\w.]*(?:\s*,\s*\*{0,2}[A-Za-z_][\w.]*)*\s+:(?:\s|$)")
_PARAM_PREFIX = re.compile(r"^\*{0,2}[A-Za-z_][\w.]*\s*(?:\([^)]*\))?\s*:\s+")
_BULLET = re.compile(r"^(?:[-*+\u2022]|\d+[.)]|\([a-z0-9]\))\s+")
_ROLE = re.compile(r"(?::[\w.+-]+)+:`([^`]+)`")
_MARKUP = [re.compile(p) for p in (r"``([^`]+)``", r"`([^`<]+?)\s*<[^>]*>`_{1,2}", r"`([^`]+)`_{0,2}")]
_MARKUP += [re.compile(r"\*\*(\S[^*]*?)\*\*"), re.compile(r"(?<![\w*])\*(\S[^*]*?)\*(?![\w*])")]
_SENTENCE_END = re.compile(r"([.!?][\"')\]]?)\s+(?=[\"'(\[]?[A-Z])")
_ADMONITION = re.compile(r"^\.\.\s+(?:note|warning|tip|important|hint|caution|attention|seealso)::")
_TRIPLE_QUOTED = re.compile(r'"""(?:.*?)"""|\'\'\'(?:.*?)\'\'\'', re.DOTALL)
_COMMENT = re.compile(r"^[ \t]*#[ \t]?(.*)$")
_ABBREVIATIONS = {"e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.", "no.", "fig.", "eq.", "mr.", "dr.", "al.", "resp."}


def find_trigger(text: str) -> str | None:
    """The normalised trigger of the first trigger form in ``text`` (whole words, any case), or None."""
    match = _TRIGGER_RE.search(text)
    return _FORM_TRIGGER[" ".join(match.group(1).lower().split())] if match else None


def trigger_pattern(trigger: str) -> re.Pattern[str]:
    """The whole-word, case-insensitive pattern of one trigger's forms."""
    if trigger not in TRIGGER_FORMS:
        raise DetectorError(f"Unknown trigger '{trigger}'. Allowed values: {', '.join(TRIGGERS)}")
    return _forms_regex(TRIGGER_FORMS[trigger])


def is_natural(text: str, *, sentence: bool = True) -> bool:
    """6-80 words, a capital first letter, >= 70% plain words, >= 75% letters, <= 5% code symbols, no
    URL or doctest; ``sentence``: it also ends in . ? or ! (documentation, not data-set records)."""
    words = text.split()
    return (
        6 <= len(words) <= 80
        and text[0].isupper()
        and (not sentence or text[-1] in ".?!")
        and ">>>" not in text
        and not _URL.search(text)
        and sum(ch in _CODE_SYMBOLS for ch in text) <= 0.05 * len(text)
        and sum(ch.isalpha() for ch in text) >= 0.75 * (len(text) - len(words) + 1)
        and sum(bool(_PLAIN_WORD.match(word)) for word in words) >= 0.7 * len(words)
    )


def keep_text(text: str, *, sentence: bool = True) -> str | None:
    """The trigger of a text the set keeps (natural, triggered, not injection-like), else None."""
    if not is_natural(text, sentence=sentence) or INJECTION_LIKE.search(text):
        return None
    return find_trigger(text)


def _role(match: re.Match[str]) -> str:
    inner = match.group(1)
    if "<" in inner:
        return inner.split("<")[0].strip()
    return inner[1:].rsplit(".", 1)[-1] if inner.startswith("~") else inner


def strip_markup(text: str) -> str:
    """reST roles, literals, links and emphasis reduced to their text."""
    text = _ROLE.sub(_role, text)
    for pattern in _MARKUP:
        text = pattern.sub(r"\1", text)
    return text


def paragraphs(doc: str) -> list[str]:
    """Prose paragraphs of a docstring or documentation text: blank lines and a smaller indent end a
    paragraph; doctests, literal blocks (after ``::``), code fences, directives (not their admonition
    text), headings' underlines and numpy-style parameter headers are dropped; bullets and Google-style
    parameter names are stripped."""
    out: list[str] = []
    block: list[str] = []
    previous_indent = 0
    literal_indent: int | None = None
    in_fence = in_doctest = False

    def flush() -> None:
        if block:
            out.append(_PARAM_PREFIX.sub("", _BULLET.sub("", " ".join(block))))
            block.clear()

    for line in inspect.cleandoc(doc).expandtabs().splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("```") or in_fence:
            flush()
            in_fence = in_fence != stripped.startswith("```")
            continue
        if literal_indent is not None:
            if not stripped or indent > literal_indent:
                continue
            literal_indent = None
        in_doctest = bool(stripped) and (in_doctest or stripped.startswith(">>>"))
        if not stripped or in_doctest or stripped.startswith(("... ", ".. ")) or _UNDERLINE.match(stripped):
            flush()
            if stripped.startswith(".. ") and not _ADMONITION.match(stripped):
                literal_indent = indent
            continue
        if (block and indent < previous_indent) or _PARAM_HEADER.match(stripped):
            flush()
            if _PARAM_HEADER.match(stripped):
                continue
        block.append(stripped)
        previous_indent = indent
        if stripped.endswith("::"):
            flush()
            literal_indent = indent
    flush()
    return out


def sentences(paragraph: str) -> list[str]:
    """Sentence split after . ? ! followed by a capital, not after an abbreviation or an initial."""
    out: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(paragraph):
        last = paragraph[start : match.end(1)].split()[-1].lstrip("\"'([").lower()
        if last not in _ABBREVIATIONS and not re.fullmatch(r"[a-z]\.", last):
            out.append(paragraph[start : match.end(1)])
            start = match.end()
    out.append(paragraph[start:])
    return [s.strip() for s in out if s.strip()]


def document_texts(docs: Iterable[str]) -> Iterator[str]:
    """Whitespace-normalised prose sentences of docstrings or documentation texts."""
    for doc in docs:
        for paragraph in paragraphs(doc):
            for sentence in sentences(strip_markup(normalize_whitespace(paragraph))):
                yield normalize_whitespace(sentence)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def file_docstrings(path: Path) -> Iterator[str]:
    """Module, class and function docstrings of one .py file with a trigger, read with ast (no import)."""
    source = _read(path)
    if not any(_TRIGGER_RE.search(match.group(0)) for match in _TRIPLE_QUOTED.finditer(source)):
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError):
        return
    stack: list[ast.AST] = [tree]
    while stack:  # statements only: docstrings open module, class and function bodies
        node = stack.pop()
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc and _TRIGGER_RE.search(doc):
                yield doc
        fields = (getattr(node, field, None) for field in ("body", "handlers", "cases", "orelse", "finalbody"))
        children = [child for field in fields if isinstance(field, list) for child in field]
        stack.extend(reversed([c for c in children if isinstance(c, ast.stmt | ast.excepthandler | ast.match_case)]))


def file_comments(path: Path) -> Iterator[str]:
    """Blocks of consecutive whole-line comments with a trigger of one .py file, one paragraph each."""
    block: list[str] = []
    for line in [*_read(path).splitlines(), ""]:
        match = _COMMENT.match(line)
        if match and not match.group(1).startswith(("!", "-*-")):
            block.append(match.group(1))
        elif block:
            if _TRIGGER_RE.search(text := " ".join(block)):
                yield text
            block = []


PERMISSIVE = frozenset("MIT BSD-2-Clause BSD-3-Clause 0BSD Apache-2.0 PSF-2.0 Zlib CC0-1.0 BSL-1.0".split())
_LICENCE_NAMES = {"mit": "MIT", "mit license": "MIT", "bsd-3-clause": "BSD-3-Clause"} | dict.fromkeys(
    ("apache", "apache 2.0", "apache-2.0", "apache 2.0 license", "apache software license"), "Apache-2.0"
)
# Distributions pinned in pyproject.toml whose docstrings are the training part.
PACKAGES: tuple[str, ...] = tuple(
    "numpy scikit-learn polars click duckdb rich mlflow dagster networkx requests pydantic pyarrow jsonschema "
    "huggingface-hub datasets torch transformers sentence-transformers accelerate peft onnx".split()
)
_SKIP_DIRS = frozenset("tests test testing idle_test _vendor vendor vendored _vendored externals __pycache__".split())
_SKIP_PACKAGE_PATHS = re.compile(r"^(?:transformers/models/|torch/_[^/]+/|functorch/|torchgen/)")
_SKIP_STDLIB = _SKIP_DIRS | {"site-packages", "dist-packages", "ensurepip", "__phello__", "lib2to3", "turtledemo"}
_STDLIB_SOURCES = ("python-docs", "python-stdlib-docstrings", "python-stdlib-comments")
DOCUMENTATION_SOURCES: tuple[str, ...] = (*_STDLIB_SOURCES, *(f"{p}-docstrings" for p in PACKAGES))
# data set -> (source name, columns whose values are texts; a list column contributes each element)
DATASET_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {"wmdp_cyber": ("wmdp-cyber", ("question", "choices"))}
DATASET_SOURCES |= {"agentpoison_strategyqa": ("strategyqa", ("question", "description"))}
DATASET_SOURCES |= {"tofu": ("tofu", ("question", "answer")), "minja": ("minja", ("instruction",))}
Kept = tuple[tuple[str, str], ...]  # (text, trigger) in reading order


@dataclasses.dataclass(frozen=True)
class SourceInfo:
    """One source of the set: its split, licence, where its texts come from and their version."""

    source: str
    split: str
    licence: str
    origin: str
    version: str


def package_licence(distribution: str) -> str:
    """SPDX licence of an installed distribution from its metadata (expression, licence field, classifier)."""
    meta = metadata.metadata(distribution)
    expression, field = (" ".join(str((meta.get_all(k) or [""])[0]).split()) for k in ("License-Expression", "License"))
    if expression:
        return expression
    names = [field.lower()] + [
        c.rsplit("::", 1)[-1].strip().lower() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")
    ]
    return next((_LICENCE_NAMES[name] for name in names if name in _LICENCE_NAMES), "unknown")


def is_permissive(licence: str) -> bool:
    tokens = [t for t in re.split(r"[()\s]+", licence) if t and t not in ("AND", "OR", "WITH")]
    return bool(tokens) and all(t in PERMISSIVE or t == "LLVM-exception" for t in tokens)


def _package_files(distribution: str) -> list[Path]:
    files = metadata.distribution(distribution).files or []
    return sorted(
        {
            Path(str(f.locate()))
            for f in files
            if f.suffix == ".py"
            and not _SKIP_DIRS.intersection(f.parts)
            and not _SKIP_PACKAGE_PATHS.match(f.as_posix())
        }
    )


def _stdlib_files() -> list[Path]:
    out: list[Path] = []
    for folder, dirs, files in os.walk(sysconfig.get_paths()["stdlib"]):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_STDLIB and not d.startswith("."))
        out.extend(Path(folder) / name for name in files if name.endswith(".py"))
    return sorted(out)


def _unique_kept(texts: Iterable[str], *, sentence: bool) -> Kept:
    """(text, trigger) of the kept texts, exact duplicates dropped, first occurrence first."""
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    for raw in texts:
        text = normalize_whitespace(raw)
        trigger = keep_text(text, sentence=sentence) if text and text not in seen else None
        if trigger:
            seen.add(text)
            out.append((text, trigger))
    return tuple(out)


@functools.cache
def documentation_source(name: str) -> tuple[SourceInfo, Kept]:
    """A documentation source's info and kept (text, trigger) pairs in reading order; ``name`` is one of
    ``DOCUMENTATION_SOURCES`` (cached: it reads installed files)."""
    python = f"Python {sys.version.split()[0]}"
    if name == "python-docs":
        import pydoc_data.topics

        topics = pydoc_data.topics.topics
        info = SourceInfo(name, "test", "PSF-2.0", "pydoc_data.topics (the Python documentation's topics)", python)
        return info, _unique_kept(document_texts(topics[key] for key in sorted(topics)), sentence=True)
    if name in _STDLIB_SOURCES:
        kind = name.rsplit("-", 1)[-1]
        read = file_docstrings if kind == "docstrings" else file_comments
        info = SourceInfo(name, "test", "PSF-2.0", f"{kind} of the standard library's .py files", python)
        return info, _unique_kept(document_texts(d for path in _stdlib_files() for d in read(path)), sentence=True)
    if name not in DOCUMENTATION_SOURCES:
        raise DetectorError(f"Unknown documentation source '{name}'. Allowed: {', '.join(DOCUMENTATION_SOURCES)}")
    distribution = name.removesuffix("-docstrings")
    licence = package_licence(distribution)
    info = SourceInfo(name, "train", licence, f"docstrings of installed {distribution}", metadata.version(distribution))
    if not is_permissive(licence):
        return info, ()
    docs = (doc for path in _package_files(distribution) for doc in file_docstrings(path))
    return info, _unique_kept(document_texts(docs), sentence=True)


def dataset_sources(source: object | None = None) -> list[tuple[SourceInfo, Kept]]:
    """The mirror's benign record sets (test side), read like the detector corpora."""
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset

    catalog, data_source = load_catalog(), source or default_dataset_source()
    out = []
    for dataset, (name, columns) in DATASET_SOURCES.items():
        spec = catalog.get(dataset)
        rows = load_dataset(spec, data_source).frame.select(columns).iter_rows()  # type: ignore[arg-type]
        values = (item for row in rows for value in row for item in (value if isinstance(value, list) else [value]))
        info = SourceInfo(name, "test", spec.licence, f"data set {dataset} ({', '.join(columns)})", dataset)
        out.append((info, _unique_kept((v for v in values if isinstance(v, str)), sentence=False)))
    return out


def corpus_texts(source: object | None = None) -> list[str]:
    """Every text the detector corpora are built from (all corpora, both splits, both labels), normalised
    as the corpora normalise them: a superset of each corpus's training and test split."""
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset
    from rvu_pipelines.detectors.corpora import SOURCE_DATASETS, deepset_rows, jailbreak_rows

    needed = sorted({d for datasets in SOURCE_DATASETS.values() for d in datasets})
    if needed != sorted(_CORPUS_DATASETS):
        raise DetectorError(f"The detector corpora read {needed}; the leak check reads {list(_CORPUS_DATASETS)}.")
    catalog, data_source = load_catalog(), source or default_dataset_source()
    frames = {d: load_dataset(catalog.get(d), data_source).frame for d in needed}  # type: ignore[arg-type]
    deepset = deepset_rows(frames["deepset_prompt_injections"])["text"].to_list()
    jailbreak = jailbreak_rows(frames["trustair_jailbreaks"], frames["awesome_chatgpt_prompts"])["text"].to_list()
    return sorted({*deepset, *jailbreak})


def leak_free(frame: pl.DataFrame, corpus: list[str]) -> pl.DataFrame:
    """Drop rows with an exact or near twin in ``corpus`` and test rows with a twin among training rows;
    then keep the smallest id of each exact or near-duplicate cluster within a split (one MinHash pass)."""
    frame = frame.sort("split", "id")
    n, split = frame.height, frame["split"].to_numpy()
    pairs = near_duplicates([*frame["text"].to_list(), *corpus]).pairs
    pairs = pairs[pairs[:, 0] < n]  # i < j: a pair with a corpus text has j >= n
    drop = np.zeros(n, dtype=bool)
    drop[pairs[pairs[:, 1] >= n, 0]] = True
    inner = pairs[pairs[:, 1] < n]
    across = split[inner[:, 0]] != split[inner[:, 1]]
    drop[np.where(split[inner[across, 0]] == "test", inner[across, 0], inner[across, 1])] = True
    within = inner[~across & ~drop[inner[:, 0]] & ~drop[inner[:, 1]]]
    keep = ~drop & (cluster_labels(n, within) == np.arange(n))
    return frame.filter(pl.Series(keep))


def _capped(frame: pl.DataFrame, caps: Mapping[str, int]) -> pl.DataFrame:
    """At most caps[split] rows per (split, trigger), round-robin over sources in seeded hash order."""
    cap = pl.col("split").replace_strict({s: caps[s] for s in SPLITS}, return_dtype=pl.Int64)
    keys = [hashlib.blake2b(f"{SEED}:{row_id}".encode()).hexdigest() for row_id in frame["id"]]
    return (
        frame.with_columns(pl.Series("_key", keys, dtype=pl.String))
        .with_columns(pl.col("_key").rank("ordinal").over("split", "trigger", "source").alias("_round"))
        .sort("split", "trigger", "_round", "_key")
        .with_columns(pl.int_range(pl.len()).over("split", "trigger").alias("_position"))
        .filter(pl.col("_position") < cap)
        .drop("_key", "_round", "_position")
    )


@dataclasses.dataclass(frozen=True)
class OverDefenseSet:
    """Benign trigger-word texts; columns id, text, trigger, source, licence, split, label (always 0)."""

    frame: pl.DataFrame
    sources: tuple[SourceInfo, ...] = ()

    def part(self, split: str) -> pl.DataFrame:
        if split not in SPLITS:
            raise DetectorError(f"Unknown split '{split}'. Allowed values: test, train")
        return self.frame.filter(pl.col("split") == split)

    def counts(self) -> pl.DataFrame:
        """Rows per split, trigger and source."""
        return self.frame.group_by("split", "trigger", "source").len().sort("split", "trigger", "source")

    def manifest(self) -> list[dict[str, object]]:
        """One row per source: source, split, licence, origin, version (package or Python version, or the
        data set), n_train, n_test."""
        grouped = self.frame.group_by("source", "split").len()
        n = {(row["source"], row["split"]): int(row["len"]) for row in grouped.iter_rows(named=True)}
        return [
            dataclasses.asdict(info) | {f"n_{split}": n.get((info.source, split), 0) for split in SPLITS}
            for info in sorted(self.sources, key=lambda i: (i.split, i.source))
        ]


def build_overdefense_set(
    source: object | None = None, *, max_per_trigger: Mapping[str, int] | None = None
) -> OverDefenseSet:
    """Build the set (see the module doc). ``source``: the data-set source (mirror or public, as for
    :func:`corpora.load_corpora`); ``max_per_trigger``: cap per split, e.g. {"test": 150, "train": 300}."""
    caps = dict(DEFAULT_MAX_PER_TRIGGER)
    for split, value in (max_per_trigger or {}).items():
        if split not in SPLITS or int(value) < 0:
            raise DetectorError(f"max_per_trigger takes a count >= 0 per split ({', '.join(SPLITS)}); got {split}.")
        caps[split] = int(value)
    loaded = [documentation_source(name) for name in DOCUMENTATION_SOURCES] + dataset_sources(source)
    rows = [
        {"id": f"{info.source}:{n:05d}", "text": text, "trigger": trigger, "source": info.source}
        | {"licence": info.licence, "split": info.split, "label": 0}
        for info, kept in loaded
        for n, (text, trigger) in enumerate(kept)
    ]
    frame = leak_free(pl.DataFrame(rows, schema=COLUMNS), corpus_texts(source))
    return OverDefenseSet(_capped(frame, caps).sort("split", "id"), tuple(info for info, _ in loaded))
