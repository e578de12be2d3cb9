"""The kill switch's evaluation sets, built from the real public data sets (templates only, nothing invented).

Every builder takes the frame the project's parser produced (``rvu_pipelines.data.parsers``) and returns
one frame with the columns ``EXAMPLE_COLUMNS``: ``text`` (what the model reads), ``label`` (1 = the kill
switch should fire: the statement is contradicted / the document carries an injected instruction),
``source``, ``group`` (the pair both members of a supported/contradicted or clean/injected pair share),
``doc_start``/``doc_end`` (characters of the part under test: the statement, or the document) and
``split``: ``heldout`` or ``calibration``. The split is fixed by a sha256 of the group, so both members of
a pair fall on the same side and no held-out example is ever used to calibrate (deepset keeps its
published train/test split: test is held out).

* Context verification (the seed's task), TOFU retain probes (real authors, world facts): the context
  states the question and its answer; the statement repeats the answer (supported, label 0) or gives
  the first perturbed answer TOFU ships (contradicted, label 1).
* Contamination: BIPIA email / table / code contexts with and without one of BIPIA's attacks (text attacks
  for email and table, code attacks for code) inserted at the start, middle or end (rotating); InjecAgent
  tool responses (the benchmark's own, label 1) against the same response template with its
  ``<Attacker Instruction>`` slot filled by a declarative TOFU answer sentence (label 0); deepset
  prompts as published (label as published).

``length_matched_clean`` adds a third member to each (clean, injected) pair — the clean text padded with
benign text to the injected text's length — with a ``role`` column, so a score can be checked against
length; ``keep_whole_groups`` applies a token-length cap without breaking pairs or triples.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import polars as pl

from rvu_pipelines.spectral.errors import SpectralInputError

EXAMPLE_COLUMNS: tuple[str, ...] = ("text", "label", "source", "group", "doc_start", "doc_end", "split")
ROLE_COLUMN = "role"  # "clean" | "injected" | "padded", only in length_matched_clean's frames
ROLES: tuple[str, ...] = ("clean", "injected", "padded")
LENGTH_TOLERANCE = 12  # characters: the padded text's length is within this of the injected text's
HELDOUT_FRACTION = 0.4
MAX_DOCUMENT_CHARS = 900
PLACEHOLDER = "<Attacker Instruction>"
CONTEXT_TEMPLATE = "Context: {question} {answer}.\nStatement: "
STATEMENT_TEMPLATE = 'The answer to "{question}" is {candidate}.'
DOCUMENT_TEMPLATE = "{instruction}\n\n"


def heldout_split(group: str, fraction: float = HELDOUT_FRACTION) -> str:
    """``heldout`` for a fixed ``fraction`` of groups (sha256 of the group id), else ``calibration``."""
    bucket = int(hashlib.sha256(group.encode("utf-8")).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "heldout" if bucket < fraction else "calibration"


def example_frame(rows: Iterable[dict]) -> pl.DataFrame:
    schema = {
        "text": pl.String,
        "label": pl.Int8,
        "source": pl.String,
        "group": pl.String,
        "doc_start": pl.Int64,
        "doc_end": pl.Int64,
        "split": pl.String,
    }
    frame = pl.DataFrame(list(rows), schema=schema)
    if frame.height == 0:
        raise SpectralInputError("The data set yielded no examples (wrong frame, or every row filtered out).")
    return frame


def _example(prefix: str, part: str, suffix: str, label: int, source: str, group: str, split: str) -> dict:
    text = prefix + part + suffix
    return {
        "text": text,
        "label": label,
        "source": source,
        "group": group,
        "doc_start": len(prefix),
        "doc_end": len(prefix) + len(part),
        "split": split,
    }


def context_verification(
    tofu: pl.DataFrame, subsets: tuple[str, ...] = ("real_authors", "world_facts")
) -> pl.DataFrame:
    """Supported (0) vs contradicted (1) statements from TOFU's QA pairs with perturbed answers."""
    rows = []
    for index, row in enumerate(tofu.filter(pl.col("subset").is_in(list(subsets))).iter_rows(named=True)):
        perturbed = [p for p in row["perturbed_answer"] if p and p.strip() and p.strip() != row["answer"].strip()]
        if not perturbed:
            continue
        question, answer = row["question"].strip(), row["answer"].strip().rstrip(".")
        group = f"tofu_{row['subset']}:{index}"
        split = heldout_split(group)
        prefix = CONTEXT_TEMPLATE.format(question=question, answer=answer)
        for label, candidate in ((0, answer), (1, perturbed[0].strip().rstrip("."))):
            statement = STATEMENT_TEMPLATE.format(question=question, candidate=candidate)
            rows.append(_example(prefix, statement, "", label, f"tofu_{row['subset']}", group, split))
    return example_frame(rows)


def _insert(context: str, attack: str, position: str) -> str:
    if position == "start":
        return f"{attack}\n{context}"
    if position == "end":
        return f"{context}\n{attack}"
    cut = context.rfind("\n", 0, len(context) // 2)
    cut = cut if cut > 0 else len(context) // 2
    return f"{context[:cut]}\n{attack}\n{context[cut:]}"


def bipia_contamination(bipia: pl.DataFrame, max_chars: int = MAX_DOCUMENT_CHARS) -> pl.DataFrame:
    """BIPIA contexts (≤ ``max_chars``) clean (0) and with a BIPIA attack inserted (1), paired."""
    tasks = bipia.filter((pl.col("record_type") == "task") & (pl.col("context").str.len_chars() <= max_chars))
    attacks = bipia.filter(pl.col("record_type") == "attack").sort(["task", "split", "category", "index"])
    by_kind = {kind: attacks.filter(pl.col("task") == kind)["text"].to_list() for kind in ("text", "code")}
    rows = []
    positions = ("end", "start", "middle")
    for number, row in enumerate(tasks.sort(["task", "split", "index"]).iter_rows(named=True)):
        kind = "code" if row["task"] == "code" else "text"
        pool = by_kind[kind]
        attack = pool[(number * 7) % len(pool)]
        group = f"bipia_{row['task']}:{row['split']}:{row['index']}"
        split = heldout_split(group)
        question = (row["question"] or "").strip() or "Summarise the document."
        prefix = DOCUMENT_TEMPLATE.format(instruction=question)
        context = row["context"].strip()
        rows.append(_example(prefix, context, "", 0, f"bipia_{row['task']}", group, split))
        injected = _insert(context, attack.strip(), positions[number % len(positions)])
        rows.append(_example(prefix, injected, "", 1, f"bipia_{row['task']}", group, split))
    return example_frame(rows)


def injecagent_contamination(injecagent: pl.DataFrame, tofu: pl.DataFrame, max_pairs: int = 200) -> pl.DataFrame:
    """InjecAgent tool responses (1) vs the same template with a benign TOFU answer in the slot (0)."""
    fillers = [a.strip() for a in tofu.filter(pl.col("subset") == "forget")["answer"].to_list() if a.strip()]
    if not fillers:
        raise SpectralInputError("InjecAgent's clean fill needs TOFU's forget answers; the TOFU frame has none.")
    cases = injecagent.filter(pl.col("tool_response_template").str.contains(PLACEHOLDER, literal=True))
    cases = cases.sort(["setting", "case_index"])
    step = max(1, cases.height // max_pairs)
    rows = []
    for number, row in enumerate(cases.gather_every(step).head(max_pairs).iter_rows(named=True)):
        template = row["tool_response_template"]
        group = f"injecagent_{row['setting']}:{row['case_index']}"
        split = heldout_split(group)
        prefix = DOCUMENT_TEMPLATE.format(instruction=row["user_instruction"].strip())
        clean = template.replace(PLACEHOLDER, fillers[number % len(fillers)].replace("'", "’"))
        attacked = template.replace(PLACEHOLDER, row["attacker_instruction"].strip())
        rows.append(_example(prefix, clean, "", 0, "injecagent", group, split))
        rows.append(_example(prefix, attacked, "", 1, "injecagent", group, split))
    return example_frame(rows)


def deepset_contamination(deepset: pl.DataFrame) -> pl.DataFrame:
    """deepset prompts as published; its test split is the held-out split."""
    rows = []
    for index, row in enumerate(deepset.iter_rows(named=True)):
        text = row["text"].strip()
        if not text:
            continue
        split = "heldout" if row["split"] == "test" else "calibration"
        rows.append(_example("", text, "", int(row["label"]), "deepset", f"deepset:{index}", split))
    return example_frame(rows)


SOURCE_FRAMES = ("tofu", "bipia", "injecagent", "deepset_prompt_injections")


def load_source_frames(source: object | None = None) -> dict[str, pl.DataFrame]:
    """The parsed data sets the evaluation sets are built from, by catalog name (mirror or public source,
    sha256-verified); the Dagster assets pass their own inputs instead."""
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset

    catalog = load_catalog()
    data_source = source or default_dataset_source()
    return {name: load_dataset(catalog.get(name), data_source).frame for name in SOURCE_FRAMES}  # type: ignore[arg-type]


def spectral_sets(frames: Mapping[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """Every evaluation set, from the parsed data sets ``SOURCE_FRAMES`` names."""
    missing = sorted(set(SOURCE_FRAMES) - set(frames))
    if missing:
        raise SpectralInputError(f"the spectral sets need the data sets {missing}")
    return {
        "context_verification": context_verification(frames["tofu"]),
        "bipia": bipia_contamination(frames["bipia"]),
        "injecagent": injecagent_contamination(frames["injecagent"], frames["tofu"]),
        "deepset": deepset_contamination(frames["deepset_prompt_injections"]),
    }


def load_spectral_datasets(source: object | None = None) -> dict[str, pl.DataFrame]:
    """Every evaluation set, read through the data catalog (mirror or public source, sha256-verified)."""
    return spectral_sets(load_source_frames(source))


def _inserted_at(clean: str, injected: str) -> tuple[int, str]:
    """Where, in ``clean``, the injected text first differs from it, and what was inserted there (the part of
    ``injected`` between the longest common prefix and the longest common suffix)."""
    prefix = 0
    limit = min(len(clean), len(injected))
    while prefix < limit and clean[prefix] == injected[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and clean[-1 - suffix] == injected[-1 - suffix]:
        suffix += 1
    return prefix, injected[prefix : len(injected) - suffix]


def _pieces(text: str) -> list[str]:
    """A document cut into lines, and long lines into sentences: the units padding is drawn from."""
    out: list[str] = []
    for line in text.splitlines():
        out.extend(p.strip() for p in re.split(r"(?<=[.!?])\s+", line) if p.strip())
    return out


def clean_pad_pool(examples: pl.DataFrame) -> dict[str, list[tuple[str, str]]]:
    """Per source, (group, piece) for every line / sentence of the label-0 documents (never a label-1 text)."""
    pool: dict[str, list[tuple[str, str]]] = {}
    for row in examples.filter(pl.col("label") == 0).iter_rows(named=True):
        doc = row["text"][row["doc_start"] : row["doc_end"]]
        pool.setdefault(row["source"], []).extend((row["group"], piece) for piece in _pieces(doc))
    return pool


def _fill(pieces: Sequence[str], target: int, tolerance: int, rng: np.random.Generator) -> str:
    """Lines from ``pieces`` (random order) joined by newlines to ``target`` ± ``tolerance`` characters; the
    last one is cut at a word boundary when no whole piece fits."""
    chosen: list[str] = []
    length = -1  # the first piece adds no separator
    for index in rng.permutation(len(pieces)):
        if length >= target - tolerance:
            break
        piece = pieces[index]
        if length + 1 + len(piece) <= target + tolerance:
            chosen.append(piece)
            length += 1 + len(piece)
    if length < target - tolerance:
        room = target - length - 1
        everything = " ".join(pieces[i] for i in rng.permutation(len(pieces)))
        long = next((pieces[i] for i in rng.permutation(len(pieces)) if len(pieces[i]) >= room), everything)
        cut = long[:room]
        space = cut.rfind(" ")
        cut = cut[:space] if space >= room - tolerance else cut
        chosen.append(cut.rstrip() or long[:room])
    return "\n".join(chosen)


def length_matched_clean(
    examples: pl.DataFrame,
    pad_pool: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    *,
    tolerance: int = LENGTH_TOLERANCE,
    seed: int = 0,
) -> pl.DataFrame:
    """Each (clean, injected) pair plus a third member: the clean text padded with benign text to the
    injected text's length (± ``tolerance`` characters), label 0, same group and split. A pair whose clean
    text is already within ``tolerance`` of the injected one's length, or longer, stays a pair.

    The padding is inserted where the injected text first differs from the clean one (the insertion point
    of BIPIA-style attacks: start, middle or end; for a slot that was *replaced*, the slot's start), on its
    own line(s). It is drawn from ``pad_pool`` — per source, (group, text) pieces; by default every line /
    sentence of the clean documents of that source (``clean_pad_pool``) — never from the same group and
    never a piece that occurs inside any pair's inserted text. Deterministic: the draw is seeded by ``seed``
    and the group id. Returns ``EXAMPLE_COLUMNS`` plus ``role`` ("clean" | "injected" | "padded")."""
    missing = [c for c in EXAMPLE_COLUMNS if c not in examples.columns]
    if missing:
        raise SpectralInputError(f"The examples lack the columns {missing}.")
    pairs: dict[str, dict[int, dict]] = {}
    for row in examples.iter_rows(named=True):
        members = pairs.setdefault(row["group"], {})
        if int(row["label"]) in members:
            raise SpectralInputError(f"Group {row['group']!r} holds more than one example labelled {row['label']}.")
        members[int(row["label"])] = row
    inserted: dict[str, tuple[int, str]] = {}
    for group, members in pairs.items():
        if set(members) != {0, 1}:
            raise SpectralInputError(f"Group {group!r} is not a (clean, injected) pair; length matching needs pairs.")
        clean, injected = members[0], members[1]
        if clean["text"][: clean["doc_start"]] != injected["text"][: injected["doc_start"]]:
            raise SpectralInputError(f"Group {group!r}: the clean and injected texts differ before the document.")
        inserted[group] = _inserted_at(
            clean["text"][clean["doc_start"] : clean["doc_end"]],
            injected["text"][injected["doc_start"] : injected["doc_end"]],
        )
    attack_text = "\n".join(part for _, part in inserted.values())
    pool = {
        source: [(g, p) for g, p in pieces if p not in attack_text]
        for source, pieces in (clean_pad_pool(examples) if pad_pool is None else pad_pool).items()
    }
    rows = []
    for group, members in pairs.items():
        clean, injected = members[0], members[1]
        doc = clean["text"][clean["doc_start"] : clean["doc_end"]]
        at = inserted[group][0]
        lead = "\n" if 0 < at and doc[at - 1] != "\n" else ""
        trail = "\n" if at < len(doc) and doc[at] != "\n" else ""
        target = len(injected["text"]) - len(clean["text"]) - len(lead) - len(trail)
        pieces = [p for g, p in pool.get(clean["source"], []) if g != group]
        if target <= tolerance:  # the clean text is already as long (InjecAgent's fill can be longer): a pair
            for row, role in ((clean, "clean"), (injected, "injected")):
                rows.append({**{c: row[c] for c in EXAMPLE_COLUMNS}, ROLE_COLUMN: role})
            continue
        if not pieces:
            raise SpectralInputError(f"No benign padding for source {clean['source']!r} (group {group!r}).")
        digest = int(hashlib.sha256(f"{seed}:{group}".encode()).hexdigest()[:16], 16)
        pad = _fill(pieces, target, tolerance, np.random.default_rng(digest))
        padded_doc = doc[:at] + lead + pad + trail + doc[at:]
        prefix = clean["text"][: clean["doc_start"]]
        suffix = clean["text"][clean["doc_end"] :]
        padded = _example(prefix, padded_doc, suffix, 0, clean["source"], group, clean["split"])
        for row, role in ((clean, "clean"), (injected, "injected"), (padded, "padded")):
            rows.append({**{c: row[c] for c in EXAMPLE_COLUMNS}, ROLE_COLUMN: role})
    frame = example_frame({c: r[c] for c in EXAMPLE_COLUMNS} for r in rows)
    return frame.with_columns(pl.Series(ROLE_COLUMN, [r[ROLE_COLUMN] for r in rows], dtype=pl.String))


def keep_whole_groups(examples: pl.DataFrame, n_tokens: Callable[[str], int], max_tokens: int) -> pl.DataFrame:
    """The examples of every group whose members all have ≤ ``max_tokens`` tokens (``n_tokens(text)``);
    a group with any longer member is dropped whole, so pairs and triples stay complete."""
    fits = pl.Series("fits", [n_tokens(text) <= max_tokens for text in examples["text"].to_list()], dtype=pl.Boolean)
    return examples.with_columns(fits).filter(pl.col("fits").all().over("group")).drop("fits")
