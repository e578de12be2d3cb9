"""The three detector corpora of seed 002 §5.1, built from the platform's data sets.

* ``deepset``: deepset/prompt-injections with its upstream train/test split (546/116); the test split
  is kept as published, the training split loses its near-duplicates of test texts (541/116, below).
* ``jailbreak``: TrustAIRLab in-the-wild jailbreak prompts (label 1) + awesome-chatgpt-prompts
  (label 0), split 80/20 by near-duplicate cluster, stratified, seed 42. This is the offline stand-in
  for the paper's jackhhao/jailbreak-classification, whose jailbreak half comes from the same
  in-the-wild prompts and whose benign half is not mirrored; :func:`jackhhao_corpus` still loads the
  real one from the hub.
* ``combined``: all three sources, split the same way.

Preprocessing is the paper's: whitespace normalisation only. The two stratified corpora also drop
exact duplicates (after normalisation), so no test text is also a training text; a text that
appears with both labels is dropped entirely. Every row keeps a stable ``id`` (``source:row``) and
frames are sorted by (split, id), so the same inputs give byte-identical corpora.

Near-duplicates. Exact deduplication is not enough: in-the-wild jailbreaks are
re-posted with small edits, and 347 of the 1,355 distinct TrustAIRLab positives (26%) have a
near-duplicate (Jaccard >= 0.5 on lowercased word 5-grams, :mod:`near_duplicates`). The paper's row-level
``train_test_split`` put 230 such pairs across the jailbreak split (68 of 509 test texts had a
training twin; combined: 276 pairs, 85 of 640). The stratified corpora are therefore split *by
cluster* (connected components of the near-duplicate relation): a whole cluster goes to one side,
with sklearn's ``StratifiedGroupKFold(5, shuffle=True, random_state=42)``, first fold = test.
Splitting by cluster was chosen over keeping one representative per cluster because it keeps every
distinct text (the corpora keep their 2,541 / 3,197 rows, so training data and class balance are
unchanged and no arbitrary representative has to be picked, nor a label for the few clusters that
mix labels), while still guaranteeing no near-twin on both sides. Clusters are small (the largest has
28 texts, <1% of the corpus), so the test fraction and class ratio stay within 0.3 points of 20% and
of the corpus ratio.

deepset is not re-split, so its test set stays the published one (comparable with the paper and
other work). It has 5 near-duplicate pairs across the upstream split (four short benign questions
at Jaccard 0.5, e.g. "Does/Did the nuclear phase-out make sense?", and one injection at 0.67); the 5
training texts of those pairs are dropped from the training split (546 -> 541), the test split is
untouched. After that no corpus has a near-duplicate pair across its split.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from rvu_pipelines.detectors.near_duplicates import cross_pairs, near_duplicates
from rvu_pipelines.errors import DatasetUnavailableError, DetectorError
from rvu_pipelines.paths import PublicSources, public_sources

CORPUS_NAMES: tuple[str, ...] = ("deepset", "jailbreak", "combined")
SPLIT_SEED = 42
TEST_FRACTION = 0.2
COLUMNS = {"id": pl.String, "text": pl.String, "label": pl.Int8, "split": pl.String, "source": pl.String}

# The platform data sets (configs/datasets.yaml) each corpus is built from.
SOURCE_DATASETS: dict[str, tuple[str, ...]] = {
    "deepset": ("deepset_prompt_injections",),
    "jailbreak": ("trustair_jailbreaks", "awesome_chatgpt_prompts"),
    "combined": ("deepset_prompt_injections", "trustair_jailbreaks", "awesome_chatgpt_prompts"),
}

DESCRIPTIONS = {
    "deepset": "deepset/prompt-injections, upstream test split (116); training split (546) less the 5 "
    "near-duplicates of test texts.",
    "jailbreak": "TrustAIRLab in-the-wild jailbreaks (1) + awesome-chatgpt-prompts (0), deduplicated, split 80/20 "
    "by near-duplicate cluster, stratified, seed 42: the offline stand-in for jackhhao/jailbreak-classification.",
    "combined": "deepset + TrustAIRLab + awesome-chatgpt-prompts, deduplicated, split 80/20 by near-duplicate "
    "cluster, stratified, seed 42.",
    "jackhhao": "jackhhao/jailbreak-classification (prompt, type) from the hub, split 80/20 by near-duplicate "
    "cluster, stratified, seed 42.",
}

JACKHHAO_REPO = "jackhhao/jailbreak-classification"
JACKHHAO_SPLITS = ("train", "test")
JACKHHAO_LABELS = {"jailbreak": 1, "benign": 0}

HfRowLoader = Callable[[str, str, str], Iterable[Mapping[str, object]]]  # (repo, split, revision) -> rows


@dataclass(frozen=True)
class Corpus:
    """One labelled corpus with its split; columns id, text, label (1 = injection), split, source."""

    name: str
    frame: pl.DataFrame
    description: str = ""

    def part(self, split: str) -> pl.DataFrame:
        if split not in ("train", "test"):
            raise DetectorError(f"Unknown split '{split}'. Allowed values: test, train")
        return self.frame.filter(pl.col("split") == split)

    def texts(self, split: str) -> list[str]:
        return self.part(split)["text"].to_list()

    def labels(self, split: str) -> np.ndarray:
        return self.part(split)["label"].to_numpy().astype(np.int64)

    def counts(self) -> dict[str, int]:
        """Rows per split and label, e.g. {"test/0": 56, "test/1": 60, ...}; the asset checks read it."""
        grouped = self.frame.group_by("split", "label").len().sort("split", "label")
        return {f"{row['split']}/{row['label']}": int(row["len"]) for row in grouped.iter_rows(named=True)}


def normalize_whitespace(text: str) -> str:
    """The paper's only preprocessing: runs of whitespace become one space, ends stripped."""
    return " ".join(str(text).split())


def _rows(source: str, texts: Iterable[str], labels: Iterable[int]) -> pl.DataFrame:
    texts, labels = list(texts), [int(label) for label in labels]
    return pl.DataFrame(
        {
            "id": [f"{source}:{i:05d}" for i in range(len(texts))],
            "text": [normalize_whitespace(t) for t in texts],
            "label": labels,
            "source": [source] * len(texts),
        },
        schema={"id": pl.String, "text": pl.String, "label": pl.Int8, "source": pl.String},
    )


def deduplicate(frame: pl.DataFrame) -> pl.DataFrame:
    """Drop empty texts and exact duplicates (first occurrence by id wins); drop texts seen with both labels."""
    frame = frame.filter(pl.col("text").str.len_chars() > 0).sort("id")
    conflicting = frame.group_by("text").agg(pl.col("label").n_unique().alias("n")).filter(pl.col("n") > 1)
    frame = frame.join(conflicting.select("text"), on="text", how="anti")
    return frame.unique(subset="text", keep="first", maintain_order=True)


def _require_both_labels(labels: np.ndarray) -> None:
    if len(set(labels.tolist())) < 2 or min(np.bincount(labels)) < 2:
        raise DetectorError(
            "A stratified split needs at least two rows of each label; the corpus has "
            f"{dict(zip(*np.unique(labels, return_counts=True), strict=True))}."
        )


def stratified_split(
    frame: pl.DataFrame, *, test_fraction: float = TEST_FRACTION, seed: int = SPLIT_SEED
) -> pl.DataFrame:
    """The paper's rule, row by row: sklearn ``train_test_split(stratify=y, random_state=42)`` over rows in
    id order. It puts near-twins on both sides; the corpora use :func:`cluster_split` (kept to measure that)."""
    from sklearn.model_selection import train_test_split

    frame = frame.sort("id")
    labels = frame["label"].to_numpy()
    _require_both_labels(labels)
    _, test_index = train_test_split(
        np.arange(frame.height), test_size=test_fraction, stratify=labels, random_state=seed
    )
    is_test = np.zeros(frame.height, dtype=bool)
    is_test[test_index] = True
    return frame.with_columns(pl.Series("split", np.where(is_test, "test", "train")))


def cluster_split(frame: pl.DataFrame, *, test_fraction: float = TEST_FRACTION, seed: int = SPLIT_SEED) -> pl.DataFrame:
    """Stratified split by near-duplicate cluster: no cluster has texts on both sides (see the module doc).

    ``StratifiedGroupKFold(round(1 / test_fraction), shuffle=True, random_state=seed)`` over rows in id
    order, groups = :func:`near_duplicates.near_duplicates` clusters; its first fold is the test split.
    """
    from sklearn.model_selection import StratifiedGroupKFold

    frame = frame.sort("id")
    labels = frame["label"].to_numpy()
    _require_both_labels(labels)
    groups = near_duplicates(frame["text"].to_list()).labels
    folds = StratifiedGroupKFold(n_splits=round(1 / test_fraction), shuffle=True, random_state=seed)
    _, test_index = next(folds.split(np.zeros(frame.height), labels, groups))
    is_test = np.zeros(frame.height, dtype=bool)
    is_test[test_index] = True
    return frame.with_columns(pl.Series("split", np.where(is_test, "test", "train")))


def cross_split_pairs(frame: pl.DataFrame, *, exact: bool = False) -> list[tuple[str, str]]:
    """(train id, test id) of every near-duplicate pair across the split (``exact``: brute force, not LSH)."""
    train, test = frame.filter(pl.col("split") == "train"), frame.filter(pl.col("split") == "test")
    pairs = cross_pairs(train["text"].to_list(), test["text"].to_list(), exact=exact)
    return sorted((train["id"][int(i)], test["id"][int(j)]) for i, j in pairs.tolist())


def drop_train_twins(frame: pl.DataFrame) -> pl.DataFrame:
    """Drop training rows that near-duplicate a test row; the test split stays as it is (deepset)."""
    twins = {train_id for train_id, _ in cross_split_pairs(frame)}
    return frame.filter(~pl.col("id").is_in(sorted(twins)))


def stratified_subsample(frame: pl.DataFrame, n: int | None, *, seed: int = SPLIT_SEED) -> pl.DataFrame:
    """At most ``n`` rows keeping the label ratio (quick runs and tests), in id order; all rows if n is None."""
    from sklearn.model_selection import train_test_split

    if n is None or n >= frame.height:
        return frame
    if n < 2:
        raise DetectorError(f"A subsample needs at least 2 rows (one per label); asked for {n}.")
    frame = frame.sort("id")
    keep, _ = train_test_split(
        np.arange(frame.height), train_size=n, stratify=frame["label"].to_numpy(), random_state=seed
    )
    return frame[np.sort(keep)]


def _finish(name: str, frame: pl.DataFrame) -> Corpus:
    frame = frame.select([pl.col(c).cast(t) for c, t in COLUMNS.items()]).sort("split", "id")
    return Corpus(name, frame, DESCRIPTIONS[name])


def require_columns(frame: pl.DataFrame, dataset: str, columns: Iterable[str]) -> None:
    missing = sorted(set(columns) - set(frame.columns))
    if missing:
        raise DetectorError(
            f"The {dataset} frame lacks columns {missing}; pass the platform's {dataset} data set "
            f"(rvu_pipelines.data.load_dataset), which has {sorted(frame.columns)}."
        )


def deepset_rows(deepset: pl.DataFrame) -> pl.DataFrame:
    require_columns(deepset, "deepset_prompt_injections", ("text", "label", "split"))
    return _rows("deepset", deepset["text"], deepset["label"]).with_columns(deepset["split"].alias("split"))


def jailbreak_rows(trustair: pl.DataFrame, awesome: pl.DataFrame) -> pl.DataFrame:
    require_columns(trustair, "trustair_jailbreaks", ("prompt", "jailbreak"))
    require_columns(awesome, "awesome_chatgpt_prompts", ("prompt",))
    positives = trustair.filter(pl.col("jailbreak"))["prompt"]
    return pl.concat(
        [_rows("trustair", positives, [1] * positives.len()), _rows("awesome", awesome["prompt"], [0] * awesome.height)]
    )


def deepset_corpus(deepset: pl.DataFrame) -> Corpus:
    """Upstream test split as published; training rows that near-duplicate a test row dropped (546 -> 541).

    No exact deduplication: it has no exact duplicates, and its test counts are the paper's.
    """
    return _finish("deepset", drop_train_twins(deepset_rows(deepset)))


def jailbreak_corpus(trustair: pl.DataFrame, awesome: pl.DataFrame) -> Corpus:
    return _finish("jailbreak", cluster_split(deduplicate(jailbreak_rows(trustair, awesome))))


def combined_corpus(deepset: pl.DataFrame, trustair: pl.DataFrame, awesome: pl.DataFrame) -> Corpus:
    rows = pl.concat([deepset_rows(deepset).drop("split"), jailbreak_rows(trustair, awesome)])
    return _finish("combined", cluster_split(deduplicate(rows)))


def build_corpus(name: str, datasets: Mapping[str, pl.DataFrame]) -> Corpus:
    """A corpus by name from the platform data sets it needs (see ``SOURCE_DATASETS``)."""
    if name not in SOURCE_DATASETS:
        raise DetectorError(f"Unknown corpus '{name}'. Allowed values: {', '.join(CORPUS_NAMES)}")
    missing = [d for d in SOURCE_DATASETS[name] if d not in datasets]
    if missing:
        raise DetectorError(f"Corpus '{name}' needs the data sets {missing}.")
    frames = [datasets[d] for d in SOURCE_DATASETS[name]]
    builders: dict[str, Callable[..., Corpus]] = {
        "deepset": deepset_corpus,
        "jailbreak": jailbreak_corpus,
        "combined": combined_corpus,
    }
    return builders[name](*frames)


def load_corpora(names: Iterable[str] = CORPUS_NAMES, source: object | None = None) -> dict[str, Corpus]:
    """Read the needed data sets (mirror or public source, sha256-verified) and build the corpora."""
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset

    names = list(names)
    for name in names:
        if name not in SOURCE_DATASETS:
            raise DetectorError(f"Unknown corpus '{name}'. Allowed values: {', '.join(CORPUS_NAMES)}")
    catalog = load_catalog()
    data_source = source or default_dataset_source()
    needed = sorted({d for name in names for d in SOURCE_DATASETS[name]})
    frames = {d: load_dataset(catalog.get(d), data_source).frame for d in needed}  # type: ignore[arg-type]
    return {name: build_corpus(name, frames) for name in names}


# ---------------------------------------------------------------- the paper's hub corpus


def _hub_rows(repo: str, split: str, revision: str, *, public: PublicSources) -> Iterable[Mapping[str, object]]:
    if public.offline:
        raise DatasetUnavailableError(
            f"{repo} lives on the HuggingFace hub, but this machine is offline (RVU_OFFLINE/HF_HUB_OFFLINE). "
            "Use the 'jailbreak' corpus (its offline stand-in), or go online."
        )
    try:
        import datasets

        return datasets.load_dataset(repo, split=split, revision=revision)
    except Exception as exc:  # network, missing repo: one clear message
        raise DatasetUnavailableError(
            f"{repo} (split {split}) could not be read from the HuggingFace hub: {type(exc).__name__}: {exc}. "
            "Use the 'jailbreak' corpus (its offline stand-in), or check the network."
        ) from exc


def jackhhao_corpus(
    loader: HfRowLoader | None = None, revision: str = "main", *, public: PublicSources | None = None
) -> Corpus:
    """jackhhao/jailbreak-classification: columns prompt, type (jailbreak | benign) -> text, label.

    Upstream train and test are pooled and re-split stratified 80/20 with seed 42, as the paper did
    (its 1,306 rows gave 1,044 / 262); exact duplicates are dropped first and the split keeps
    near-duplicate clusters whole, as for the other stratified corpora. ``public``: whether the hub may be
    reached (default: as configured).
    """
    load = loader or functools.partial(_hub_rows, public=public or public_sources())
    texts: list[str] = []
    labels: list[int] = []
    for split in JACKHHAO_SPLITS:
        for number, row in enumerate(load(JACKHHAO_REPO, split, revision)):
            kind = str(row.get("type", "")).strip().lower()
            if kind not in JACKHHAO_LABELS or not isinstance(row.get("prompt"), str):
                raise DetectorError(
                    f"{JACKHHAO_REPO} {split} row {number}: expected a string 'prompt' and 'type' in "
                    f"{sorted(JACKHHAO_LABELS)}, got type={row.get('type')!r}."
                )
            texts.append(str(row["prompt"]))
            labels.append(JACKHHAO_LABELS[kind])
    return _finish("jackhhao", cluster_split(deduplicate(_rows("jackhhao", texts, labels))))
