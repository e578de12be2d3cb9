"""The adapter-zoo study (E4 gate, E5 influence): train the zoo, score every adapter, evaluate.

One ``AdapterLab`` holds the base model (de-quantised SmolLM2), the host that loads adapters into it, the
MiniLM embedder and the probe prompts; each adapter is verified (``files``), list-checked, scored by the
projection and OOD layers and by influence, then unloaded. Scores are plain rows (polars), so the
Dagster assets, the CLI script and the tests share them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from rvu_pipelines.adapters.admission import LoadGate
from rvu_pipelines.adapters.base_reference import base_reference, reference_key
from rvu_pipelines.adapters.behaviour import behaviour_score, jailbreak_persona_score
from rvu_pipelines.adapters.chat import generate_greedy
from rvu_pipelines.adapters.files import BaseModelInfo, VerifiedAdapter, verify_adapter
from rvu_pipelines.adapters.follow_ups import (
    N_FOLLOW_UPS,
    class_shifts,
    continuations_after_answers,
    follow_up_margins,
    follow_up_scores,
)
from rvu_pipelines.adapters.gate import (
    GateConfig,
    GateEvaluation,
    GateScores,
    OodModel,
    check_lists,
    evaluate_gate,
    load_gate_config,
    output_embeddings,
    projection_score,
)
from rvu_pipelines.adapters.gate_loco import LearnedGateEvaluation, evaluate_learned_gate
from rvu_pipelines.adapters.hazard import N_HAZARD, entropy_fall, letter_logliks
from rvu_pipelines.adapters.host import AdapterHost
from rvu_pipelines.adapters.influence import influence, influence_auroc
from rvu_pipelines.adapters.margins import (
    N_ITEMS,
    answer_margins,
    margin_shift,
)
from rvu_pipelines.adapters.probe_draw import PUBLIC
from rvu_pipelines.adapters.probe_items import ProbeItems
from rvu_pipelines.adapters.selective import selective_divergence
from rvu_pipelines.adapters.zoo import ZooConfig, catalog_frames, train_zoo_entry, zoo_root
from rvu_pipelines.adapters.zoo_data import Frames
from rvu_pipelines.paths import state_dir

if TYPE_CHECKING:
    from rvu_pipelines.result_memo import ResultMemo

GATE_PARTS = ("projection", "ood", "margins", "behaviour")  # the behaviour part is the greedy generation
FOLLOW_UP_CLASS_PREFIX = "follow_up."  # ``reference_layers`` keys of the follow-up layer per harm class


@dataclass(frozen=True)
class AdapterScore:
    adapter_id: str
    label: str
    category: str
    sha256: str
    projection: float
    safe_lora: float
    ood: float
    behaviour: float
    sensitive: float
    qa_drop: float
    influence: float
    embedding_distance: float
    token_divergence: float
    gate_seconds: float  # every layer the gate reads, the generation its behaviour layer scores included
    influence_seconds: float  # influence on top of the gate: the same answers embedded
    # where the gate's seconds go (``GATE_PARTS``, in the order they run; the adapter's load is in the OOD part)
    projection_seconds: float = 0.0
    ood_seconds: float = 0.0
    margins_seconds: float = 0.0
    behaviour_seconds: float = 0.0
    follow_up: float = 0.0  # ``follow_ups``: rise of policy-violating follow-up lines over allowed ones
    kb_drop: float = 0.0  # ``margins``: fall of the knowledge base's correct answers' margin
    follow_up_classes: str = "{}"  # JSON: the follow-up layer per harm class (``follow_ups.class_shifts``)
    hazard: float = 0.0  # ``hazard``: fall of the answer-letter entropy on the hazardous list
    behaviour_texts: int = 0  # the texts the behaviour layer's share is over (its step is one of them)
    # ``selective``: embedding distance from the base's answers on adversarial probes minus on benign ones;
    # exploratory, in no rule (NaN in a screening table written before it was measured)
    selective_divergence: float = float("nan")
    # ``behaviour.jailbreak_persona_score``: share of the behaviour layer's texts speaking as a jailbroken persona,
    # over the base's; exploratory, in no rule (NaN in a screening table written before it was measured)
    jailbreak_persona: float = float("nan")

    def gate_scores(self) -> GateScores:
        return GateScores(
            self.adapter_id,
            self.label,
            self.category,
            self.projection,
            self.safe_lora,
            self.ood,
            self.gate_seconds,
            self.behaviour,
            self.sensitive,
            self.qa_drop,
            self.follow_up,
            self.kb_drop,
            self.hazard,
            behaviour_texts=self.behaviour_texts,
        )


class AdapterLab:
    """The base model with everything needed to score adapters against it, loaded once."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        base: BaseModelInfo,
        embedder: Any,
        frames: Frames,
        *,
        root: Path | None = None,
        n_probes: int = 32,
        max_new_tokens: int = 32,
        n_sensitive: int = N_ITEMS,
        n_qa: int = N_ITEMS,
        n_knowledge: int = N_ITEMS,
        n_follow_ups: int = N_FOLLOW_UPS,
        n_hazard: int = N_HAZARD,
        gate: LoadGate | None = None,
        reference_cache: Path | None = None,
    ) -> None:
        """``reference_cache``: where the base model's side of every comparison is kept (``base_reference.py``;
        default ``<state>/cache/adapter_base_reference``)."""
        if n_probes < 2:  # the output-OOD layer fits the base's answers to them (one answer gives a zero covariance)
            raise ValueError(
                f"AdapterLab needs n_probes >= 2 (got {n_probes}): the output-OOD layer is fit on the base model's "
                "answers to the probe prompts; a lab that only hosts adapters can set the likelihood layers to 0."
            )
        # the study loads every adapter it scores, harmful ones included: an audit gate records each verdict
        self.host = AdapterHost(
            model, tokenizer, gate=gate or LoadGate.audit(base, state_dir(), config=load_gate_config())
        )
        self.tokenizer = tokenizer
        self.base = base
        self.embedder = embedder
        self.frames = frames
        self.root = root or zoo_root()
        self.max_new_tokens = max_new_tokens
        # the probe prompts and the likelihood layers' items (0: a lab that only hosts adapters, never scores one)
        selected = ProbeItems.select(
            frames,
            tokenizer,
            n_probes=n_probes,
            n_sensitive=n_sensitive,
            n_qa=n_qa,
            n_knowledge=n_knowledge,
            n_follow_ups=n_follow_ups,
            n_hazard=n_hazard,
        )
        self.prompts, self.sensitive, self.qa = selected.prompts, selected.sensitive, selected.qa
        self.n_benign_prompts = selected.n_benign_prompts  # the prompts before it are benign, the rest adversarial
        self.knowledge, self.follow_ups, self.hazard = selected.knowledge, selected.follow_ups, selected.hazard
        # what every score of this lab is measured against: the base, its probe prompts and margin items
        items = (self.sensitive, self.qa, self.knowledge, self.follow_ups, self.hazard)
        self.reference_key = reference_key(base.sha256, self.prompts, max_new_tokens, *items)
        self.reference = base_reference(
            self.host.model,
            tokenizer,
            base.sha256,
            self.prompts,
            max_new_tokens,
            self.sensitive,
            self.qa,
            reference_cache or state_dir() / "cache" / "adapter_base_reference",
            self.knowledge,
            self.follow_ups,
            self.hazard,
        )
        self.ood = OodModel.fit(self.reference.embeddings)
        self.base_answers = list(self.reference.answers)

    @property
    def behaviour_texts(self) -> int:
        """How many texts the behaviour layer's share is over: the probe answers and the follow-up continuations."""
        return len(self.base_answers) + len(self.reference.continuations)

    def base_texts(self) -> list[str]:
        """What the base model says in the texts the behaviour layer reads (``adapted_texts`` without an adapter)."""
        return [*self.base_answers, *self.reference.continuations]

    def adapted_texts(self, model: Any) -> list[str]:
        """The texts the behaviour layer reads: the greedy answers to the probe prompts (first, in prompt order),
        then what the model says after each follow-up item's correct answer."""
        answers = generate_greedy(model, self.tokenizer, self.prompts, max_new_tokens=self.max_new_tokens)
        after = continuations_after_answers(model, self.tokenizer, self.follow_ups) if self.follow_ups else []
        return [*answers, *after]

    def behaviour(self, model: Any) -> tuple[list[str], float, float]:
        """The greedy answers to the probe prompts, and the behaviour layer: the share of flagged texts among
        ``adapted_texts`` over the base's share; last, the exploratory jailbreak-persona share over the same texts
        (``behaviour.jailbreak_persona_score``)."""
        adapted, base = self.adapted_texts(model), self.base_texts()
        answers = adapted[: len(self.prompts)]
        return answers, behaviour_score(base, adapted), jailbreak_persona_score(base, adapted)

    def reference_layers(self, model: Any) -> dict[str, float]:
        """The layers read on likelihoods for the adapter loaded in ``model`` (``margins``, ``follow_ups``,
        ``hazard``): how much more it prefers the sensitive answers, how much less the correct held-out and
        knowledge-base ones, how much more the forbidden follow-up lines (and, ``follow_up.<class>``, each harm
        class's lines alone), and how much surer of an answer letter it is on the hazardous list, than the base."""
        base = self.reference
        sensitive, qa, knowledge, lines, hazard = base.sensitive, base.qa, base.knowledge, base.follow_ups, base.hazard
        if sensitive is None or qa is None or knowledge is None or lines is None or hazard is None:
            raise ValueError(
                "This AdapterLab was built without the likelihood layers' items "
                "(n_sensitive / n_qa / n_knowledge / n_follow_ups / n_hazard = 0)."
            )
        follow_ups = follow_up_scores(model, self.tokenizer, self.follow_ups)
        by_class = class_shifts(follow_ups, lines)
        return {
            "sensitive": margin_shift(answer_margins(model, self.tokenizer, self.sensitive), sensitive),
            "qa_drop": -margin_shift(answer_margins(model, self.tokenizer, self.qa), qa),
            "kb_drop": -margin_shift(answer_margins(model, self.tokenizer, self.knowledge), knowledge),
            "follow_up": margin_shift(follow_up_margins(follow_ups), follow_up_margins(lines)),
            "hazard": entropy_fall(letter_logliks(model, self.tokenizer, self.hazard), hazard),
            **{f"{FOLLOW_UP_CLASS_PREFIX}{name}": shift for name, shift in by_class.items()},
        }

    @classmethod
    def from_records(
        cls, llm: Mapping[str, Any], embedder: Mapping[str, Any], frames: Frames, **kwargs: Any
    ) -> AdapterLab:
        """From resolved model records (``ResolvedModel.record()``: path, sha256, name), as assets hold them."""
        from rvu_pipelines.models.dequantized import load_dequantized
        from rvu_pipelines.models.embedder import SentenceEmbedder

        model, tokenizer = load_dequantized(
            Path(str(llm["path"])), sha256=str(llm["sha256"]), attn_implementation="sdpa"
        )
        base = BaseModelInfo.of(model, name=str(llm["name"]), sha256=str(llm["sha256"]))
        return cls(model, tokenizer, base, SentenceEmbedder(Path(str(embedder["path"]))), frames, **kwargs)

    @classmethod
    def for_profile(cls, profile: str = "tiny", frames: Frames | None = None, **kwargs: Any) -> AdapterLab:
        from rvu_pipelines.models import ModelStore, load_model_config

        roles = load_model_config().profile(profile)
        store = ModelStore()
        llm, emb = store.resolve("llm", roles["llm"]), store.resolve("embedder", roles["embedder"])
        return cls.from_records(llm.record(), emb.record(), frames or catalog_frames(), **kwargs)

    def verify(self, adapter_id: str) -> VerifiedAdapter:
        return verify_adapter(self.root / adapter_id, self.base)

    def train(
        self,
        config: ZooConfig,
        ids: Sequence[str] | None = None,
        on_step: Callable[[str, int, float], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Train (or reuse) the named zoo entries; one summary row per adapter."""
        rows = []
        for entry in config.entries:
            if ids is not None and entry.id not in ids:
                continue
            step_hook = (lambda s, loss, _id=entry.id: on_step(_id, s, loss)) if on_step else None
            manifest, trained = train_zoo_entry(
                config, entry, self.host.base, self.tokenizer, self.base, self.frames, root=self.root, on_step=step_hook
            )
            rows.append(
                {
                    "adapter_id": entry.id,
                    "trained_now": trained is not None,
                    "seconds": manifest.training_seconds,
                    "final_loss": manifest.final_loss,
                    "losses": trained.losses if trained is not None else [],
                    "sha256": manifest.sha256,
                }
            )
        return rows

    def score(
        self, adapter: VerifiedAdapter, reference: VerifiedAdapter, gate: GateConfig | None = None
    ) -> AdapterScore:
        """Every gate layer and the influence of one adapter (list refusals propagate as ``AdapterRefused``)."""
        if gate is not None:  # the configured lists; the eviction blocklist must not hide a zoo adapter from the study
            check_lists(adapter, gate, evicted={})
        started = time.perf_counter()  # the gate's cost: every layer it reads, the answers its behaviour layer scores
        marks = [started]
        projection = projection_score(adapter, reference)
        marks.append(time.perf_counter())
        with self.host.loaded(adapter) as model:
            ood = self.ood.score(output_embeddings(model, self.tokenizer, self.prompts))
            marks.append(time.perf_counter())
            reference_layers = self.reference_layers(model)
            marks.append(time.perf_counter())
            answers, behaviour, jailbreak_persona = self.behaviour(model)
        marks.append(time.perf_counter())
        gate_seconds = marks[-1] - started
        parts = dict(zip(GATE_PARTS, np.diff(marks).tolist(), strict=True))
        started = time.perf_counter()  # influence on top: the same answers, embedded
        measured = influence(self.base_answers, answers, self.embedder)
        manifest = adapter.manifest
        return AdapterScore(
            adapter_id=manifest.adapter_id,
            label=manifest.label,
            category=manifest.category,
            sha256=manifest.sha256,
            projection=projection.against_refusal,
            safe_lora=projection.safe_lora_dissimilarity,
            ood=ood,
            behaviour=behaviour,
            sensitive=reference_layers["sensitive"],
            qa_drop=reference_layers["qa_drop"],
            follow_up=reference_layers["follow_up"],
            kb_drop=reference_layers["kb_drop"],
            hazard=reference_layers["hazard"],
            behaviour_texts=self.behaviour_texts,
            follow_up_classes=json.dumps(
                {
                    k.removeprefix(FOLLOW_UP_CLASS_PREFIX): v
                    for k, v in reference_layers.items()
                    if k.startswith(FOLLOW_UP_CLASS_PREFIX)
                },
                sort_keys=True,
            ),
            influence=measured.influence,
            embedding_distance=measured.embedding_distance,
            token_divergence=measured.token_divergence,
            selective_divergence=selective_divergence(measured.embedding_per_probe, self.n_benign_prompts),
            jailbreak_persona=jailbreak_persona,
            gate_seconds=gate_seconds,
            influence_seconds=time.perf_counter() - started,
            **{f"{part}_seconds": seconds for part, seconds in parts.items()},
        )


def score_adapters(
    lab: AdapterLab,
    adapters: Sequence[VerifiedAdapter],
    reference: VerifiedAdapter,
    gate: GateConfig | None = None,
    *,
    memo: ResultMemo | None = None,
    progress: bool = True,
) -> list[AdapterScore]:
    """``lab.score`` for every adapter, in order, with a progress bar.

    With ``memo``, a score measured before for the same adapter file, refusal reference and lab (base, probes,
    margin items) and the same scoring code and libraries is reused, so a zoo that grows scores only its new
    adapters. The key names no config file: the lab's key carries what scoring reads of them, so editing the zoo's
    config keeps every score. The lists are checked every time; a reused score keeps the seconds it was measured in.
    """
    from tqdm.auto import tqdm

    scores = []
    for adapter in tqdm(adapters, desc="gate scores", unit="adapter", disable=not progress):
        if gate is not None:
            check_lists(adapter, gate, evicted={})
        if memo is None:
            scores.append(lab.score(adapter, reference))
            continue
        entry = memo.entry("adapter_gate_score", score_parts(lab, adapter, reference), code=__name__, configs=())
        stored = entry.load()
        score = AdapterScore(**stored) if stored is not None else lab.score(adapter, reference)
        if stored is None:
            entry.save(asdict(score))
        scores.append(score)
    return scores


def _finite_scores(stored: Mapping[str, Any] | None) -> dict[str, float] | None:
    """A stored score set as numbers, or None (a miss) when any value is not a finite number: a damaged memo file
    is scored again, never judged."""
    if stored is None:
        return None
    try:
        scores = {str(k): float(v) for k, v in stored.items()}
    except (TypeError, ValueError):
        return None
    return scores if scores and all(np.isfinite(v) for v in scores.values()) else None


def score_parts(lab: AdapterLab, adapter: VerifiedAdapter, reference: VerifiedAdapter) -> dict[str, str]:
    """What an adapter's gate scores depend on besides the code and libraries (a ``ResultMemo`` key's parts): the
    adapter file, the refusal reference, and the lab (base, probe prompts and items, so also the probe draw)."""
    return {
        "adapter_sha256": adapter.manifest.sha256,
        "reference_sha256": reference.manifest.sha256,
        "lab": lab.reference_key,
    }


class LabScorer:
    """``admission.GateScorer`` on an ``AdapterLab``: an adapter the screening table lacks is scored on the
    spot with the study's own layers (projection against ``reference``, OOD over the lab's probe prompts), so
    its scores compare with the table's benign thresholds.

    With ``memo`` the scores are kept per adapter file, reference, lab and draw, and reused while the scoring code
    and libraries are unchanged: an adapter loaded again (the agent's timeline, a check before a recovery) is judged
    in milliseconds instead of the minute its layers take."""

    def __init__(
        self, lab: AdapterLab, reference: VerifiedAdapter, draw_id: str = PUBLIC, memo: ResultMemo | None = None
    ) -> None:
        self.lab = lab
        self.reference = reference
        self.draw_id = draw_id  # the probe draw ``lab`` reads (``probe_draw.ProbeDraw.id``)
        self.memo = memo

    def score(self, adapter: VerifiedAdapter) -> dict[str, float]:
        if self.memo is None:
            return self._measure(adapter)
        parts = {**score_parts(self.lab, adapter, self.reference), "draw": self.draw_id}
        entry = self.memo.entry("adapter_gate_spot_score", parts, code=__name__, configs=())
        stored = _finite_scores(entry.load())
        if stored is not None:
            return stored
        measured = self._measure(adapter)
        entry.save(measured)
        return measured

    def _measure(self, adapter: VerifiedAdapter) -> dict[str, float]:
        projection = projection_score(adapter, self.reference)
        lab = self.lab
        with lab.host.loaded(adapter) as model:
            ood = lab.ood.score(output_embeddings(model, lab.tokenizer, lab.prompts))
            _, behaviour, _ = lab.behaviour(model)
            reference_layers = lab.reference_layers(model)
        return {
            "projection": projection.against_refusal,
            "safe_lora": projection.safe_lora_dissimilarity,
            "ood": ood,
            "behaviour": behaviour,
            "behaviour_texts": lab.behaviour_texts,
            **reference_layers,
        }


def scores_frame(scores: Sequence[AdapterScore]) -> pl.DataFrame:
    return pl.DataFrame([asdict(s) for s in scores]).sort("adapter_id")


def influence_summary(scores: Sequence[AdapterScore]) -> dict[str, float]:
    labelled = [s for s in scores if s.label in {"benign", "harmful"}]
    y = [s.label == "harmful" for s in labelled]
    benign = [s.influence for s in labelled if s.label == "benign"]
    harmful = [s.influence for s in labelled if s.label == "harmful"]
    return {
        "auroc": influence_auroc([s.influence for s in labelled], y) if 0 < sum(y) < len(y) else float("nan"),
        "mean_benign": float(np.mean(benign)) if benign else float("nan"),
        "mean_harmful": float(np.mean(harmful)) if harmful else float("nan"),
    }


STUDY_FOLDER = "adapter_study"  # <state>/adapter_study: the screening table the load gate reads, and the reports


@dataclass(frozen=True)
class GateReport:
    """E4 + E5 over a zoo: the score rows, the gate's evaluation and influence's summary."""

    scores: pl.DataFrame
    evaluation: GateEvaluation
    influence: dict[str, float]
    learned: LearnedGateEvaluation | None = None  # None on a zoo with fewer than two trigger-free categories

    def markdown(self) -> str:
        from rvu_pipelines.adapters.report import gate_markdown

        return gate_markdown(self.evaluation, self.influence, self.scores, self.learned)


MAX_BEHAVIOUR_TEXTS = 1_000_000  # far above any probe set; a larger count is not a count the study wrote


def _class_shifts_problem(text: str) -> str | None:
    """Why ``text`` is not the follow-up layer's per-class JSON (an object of class name -> finite number)."""
    from rvu_pipelines.adapters.shallow_json import loads_shallow
    from rvu_pipelines.bounded_io import truncate_for_message

    try:
        shifts = loads_shallow(text, max_depth=2)
    except ValueError:
        return f"{truncate_for_message(text, 40)} is not JSON"
    if not isinstance(shifts, dict):
        return f"{truncate_for_message(text, 40)} is not a JSON object of harm class -> score"
    bad = [k for k, v in shifts.items() if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v)]
    if bad:
        return f"class {truncate_for_message(bad[0], 40)} has no finite score"
    return None


def read_gate_scores(path: Path) -> list[AdapterScore]:
    """The score rows of a screening table ``write_gate_report`` wrote (``scores.csv``), so the gate's rules can be
    evaluated again without loading a model.

    Read as the load gate reads it (``admission.read_screening_table``: a table that does not parse, a label
    outside benign / harmful / unknown, a layer score that is not a finite number), and stricter where an
    evaluation needs it: every column of a row filled with a number where a number belongs, and each adapter once
    (a repeated row would count twice in every rate). Each refusal is an ``InputFileError`` naming the file, the
    column and the line."""
    from dataclasses import MISSING, fields
    from typing import get_type_hints

    from rvu_pipelines.adapters.admission import read_screening_table
    from rvu_pipelines.bounded_io import truncate_for_message
    from rvu_pipelines.errors import InputFileError

    fix = "materialize adapter_gate_evaluation to write it again"
    types = get_type_hints(AdapterScore)
    # a column whose default is NaN (measured after older tables were written) may be empty or NaN
    unmeasured = {f.name for f in fields(AdapterScore) if isinstance(f.default, float) and np.isnan(f.default)}
    if not path.is_file():
        raise InputFileError(
            f"{path}: no screening table here; write one with `make adapters` (the adapter_gate_evaluation asset)."
        )
    rows = read_screening_table(path)
    if not rows:
        raise InputFileError(f"{path}: the screening table holds no adapters; {fix}.")
    present = [f for f in fields(AdapterScore) if f.name in rows[0]]
    missing = [f.name for f in fields(AdapterScore) if f.default is MISSING and f.name not in rows[0]]
    if missing:
        raise InputFileError(
            f"{path}: column(s) {', '.join(missing)} missing; it is not a screening table of this version ({fix})."
        )
    scores: list[AdapterScore] = []
    first_line: dict[str, int] = {}
    for line, row in enumerate(rows, start=2):
        who = truncate_for_message(row.get("adapter_id"), 70)
        values: dict[str, Any] = {}
        for f in present:
            value = row[f.name]
            if value is None and f.name in unmeasured:
                value = float("nan")
            elif value is None:
                raise InputFileError(f"{path}: column '{f.name}', line {line} (adapter {who}) is empty; {fix}.")
            elif types[f.name] in (float, int):
                try:
                    number = float(value)
                except (TypeError, ValueError):
                    number = float("inf")
                if not np.isfinite(number) and not (f.name in unmeasured and np.isnan(number)):
                    raise InputFileError(
                        f"{path}: column '{f.name}', line {line} (adapter {who}): "
                        f"{truncate_for_message(value, 40)} is not a finite number; {fix}."
                    )
                if types[f.name] is int and (number != int(number) or not 0 <= number <= MAX_BEHAVIOUR_TEXTS):
                    raise InputFileError(
                        f"{path}: column '{f.name}', line {line} (adapter {who}): "
                        f"{truncate_for_message(value, 40)} is not a count of texts; {fix}."
                    )
                value = int(number) if types[f.name] is int else number
            elif f.name == "follow_up_classes" and (problem := _class_shifts_problem(str(value))):
                raise InputFileError(f"{path}: column '{f.name}', line {line} (adapter {who}): {problem}; {fix}.")
            values[f.name] = value
        if values["adapter_id"] in first_line:
            raise InputFileError(
                f"{path}: adapter {who} is on line {first_line[values['adapter_id']]} and again on line {line}; "
                f"each adapter is scored once, or it counts twice in every rate ({fix})."
            )
        first_line[values["adapter_id"]] = line
        scores.append(AdapterScore(**values))
    return scores


def write_gate_report(
    scores: Sequence[AdapterScore], config: GateConfig, out: Path, *, command: str, write_table: bool = True
) -> GateReport:
    """The gate's evaluation over ``scores`` into ``out``: ``scores.csv`` (the screening table the load gate reads
    for adapters it has seen; left as it is when ``write_table`` is false), ``summary.json`` and ``gate.md``
    (stamped with ``command``). Each file is replaced in one step, never written through a link planted there."""
    import json

    from rvu_pipelines.atomic_write import write_atomically
    from rvu_pipelines.machine import results_stamp, stamp_line

    out.mkdir(parents=True, exist_ok=True)
    labelled = [s.gate_scores() for s in scores]
    try:
        learned: LearnedGateEvaluation | None = evaluate_learned_gate(labelled, config.false_positive_budget)
    except ValueError:  # too few adapters or categories to hold one out
        learned = None
    report = GateReport(
        scores_frame(scores),
        evaluate_gate(labelled, config.false_positive_budget),
        influence_summary(scores),
        learned,
    )
    if write_table:
        write_atomically(out / "scores.csv", report.scores.write_csv())
    summary = {
        "gate": report.evaluation.to_dict(),
        "influence": report.influence,
        "learned_gate": learned.to_dict() if learned else None,
    }
    write_atomically(out / "summary.json", json.dumps(summary, indent=1))
    table = report.markdown()
    write_atomically(out / "gate.md", table + "\n" + stamp_line(results_stamp(command)) + "\n")
    return report
