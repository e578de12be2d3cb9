"""The gate on every adapter load: screen, decide, record, and only then hand llama.cpp a file.

``LoadGate.check`` judges a verified adapter (``files.verify_adapter``) in the order the checks cost:

1. an operator's explicit allow entry for its sha256 (``allow.json``, written by ``rvu adapters allow``)
   admits it, recorded as ``operator_allow`` with who allowed it and why;
2. layer 1, the lists (``configs/adapters.yaml gate:`` and the eviction blocklist): ``blocklisted`` /
   ``not_allowlisted``;
3. the behavioural layers (``gate.SCREEN_LAYERS``: projection against the refusal reference, output OOD, behaviour,
   sensitive lists, held-out QA), read from the screening table by sha256 or, when the table does not have the
   adapter, computed on the spot by the gate's ``scorer``. Under ``gate.rule: any_layer`` (the default) a layer's
   score above the ``1 - false_positive_budget`` quantile of the table's benign adapters refuses; under
   ``all_layers`` each layer is standardised against the benign adapters and the largest z refuses when it is above
   that quantile of the benign adapters' own largest z (each against the others). The reason code names the layer
   (``gate_projection``, ``gate_ood``, ...). With no score or no benign thresholds the adapter is ``not_screened``:
   refused unless ``gate.unscreened: admit`` says otherwise. The layers read one probe draw (``probe_draw``): the
   published one, or with ``gate.probe_draw: private`` the operator's secret one, whose own screening table sets
   the thresholds and whose scorer scores on the spot; every verdict names the draw.

Every verdict, admitted or refused, is one line of the gate's ledger (``GateLedger``, JSON lines) and goes
to every ``recorder`` (the provenance store's event log, an incident log's ``adapter_refused`` line).
``admit`` writes the GGUF llama.cpp reads into the gate's own folder and records that file's sha256;
``LlamaAdapterSlots`` loads only a GGUF whose sha256 the ledger admitted for an adapter not blocklisted
since, so a file converted elsewhere, or planted beside an adapter's weights, never reaches llama.cpp.

``enforce=False`` (audit) records the same verdicts and raises nothing: the studies that must load
harmful adapters to measure them say so by constructing an audit gate. A call-site ``override`` admits a
refused adapter with the text recorded beside the refusal (an experiment that needs the adapter loaded).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import BaseModelInfo, VerifiedAdapter, verify_adapter
from rvu_pipelines.adapters.gate import (
    SCREEN_LAYERS,
    GateConfig,
    gate_dir,
    layer_steps,
    list_verdict,
    quantile_threshold,
    standard_score,
)
from rvu_pipelines.adapters.probe_draw import PUBLIC, ProbeDraw, configured_draw, screening_table_path
from rvu_pipelines.adapters.shallow_json import loads_shallow
from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.bounded_io import read_input_file, truncate_for_message
from rvu_pipelines.errors import InputFileError
from rvu_pipelines.hashing import sha256_file

BEHAVIOURAL_LAYERS = SCREEN_LAYERS  # judged by GateConfig.rule against the benign adapters' scores
Decision = Literal["admit", "refuse"]
Scored = Literal["table", "on_the_spot", "none"]
LEDGER_NAME = "gate_ledger.jsonl"
ALLOW_NAME = "allow.json"
MAX_LEDGER_BYTES = 256 << 20  # a verdict is ~1 KB: a quarter of a million loads before the ledger is rotated


class GateScorer(Protocol):
    """Scores the behavioural layers of one adapter (``study.LabScorer`` on the de-quantised base). A scorer with
    a ``draw_id`` attribute says which probe draw it reads; one without reads the public draw."""

    def score(self, adapter: VerifiedAdapter) -> Mapping[str, float]: ...


def scorer_draw(scorer: GateScorer) -> str:
    return str(getattr(scorer, "draw_id", PUBLIC))


def require_scorer_of_draw(scorer: GateScorer, draw_id: str) -> None:
    """Raise ``ValueError`` unless ``scorer`` reads the draw ``draw_id``: scores of one draw are never judged
    against another draw's thresholds."""
    if scorer_draw(scorer) != draw_id:
        raise ValueError(
            f"The gate judges on probe draw {draw_id} but its scorer reads {scorer_draw(scorer)}; build the scorer "
            "for the gate's draw (draw_scoring.LazyLabScorer(..., draw=...))."
        )


@dataclass(frozen=True)
class GateVerdict:
    """What the gate decided about one adapter and on what evidence; ``record()`` is its ledger line."""

    adapter_id: str
    sha256: str
    source: str
    folder: str
    decision: Decision
    reason: str  # "pass", "operator_allow", "override", "unscreened_admitted" or a refusal reason
    message: str
    lists: str = "not_checked"
    layers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    scored: Scored = "none"
    override: str | None = None
    refused_for: str | None = None  # the refusal an override or an allow entry set aside
    draw: str = PUBLIC  # the probe draw the layers were read on (``probe_draw.ProbeDraw.id``; never its seed)

    @property
    def admitted(self) -> bool:
        return self.decision == "admit"

    def record(self) -> dict[str, Any]:
        return {
            "event": "verdict",
            "at": time.time(),
            **asdict(self),
            "layers": {k: dict(v) for k, v in self.layers.items()},
        }


def benign_values(scores: Iterable[Mapping[str, Any]]) -> dict[str, tuple[float, ...]]:
    """Per behavioural layer, the benign adapters' scores ({} with fewer than 2 benign adapters). A table written
    before a layer existed has no column for it: that layer is not judged."""
    rows = [r for r in scores if r.get("label") == "benign"]
    if len(rows) < 2:
        return {}
    return {
        layer: tuple(float(r[layer]) for r in rows)
        for layer in BEHAVIOURAL_LAYERS
        if all(r.get(layer) is not None for r in rows)
    }


def benign_thresholds(scores: Iterable[Mapping[str, Any]], budget: float) -> dict[str, float]:
    """Per behavioural layer, the ``1 - budget`` quantile of the benign adapters' scores ({} with fewer than 2)."""
    return {layer: quantile_threshold(values, budget) for layer, values in benign_values(scores).items()}


def benign_steps(scores: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """``gate.layer_steps`` of the table's benign adapters: one text of the behaviour layer's share."""
    return layer_steps(r.get("behaviour_texts") for r in scores if r.get("label") == "benign")


def largest_z_threshold(
    benign: Mapping[str, Sequence[float]], budget: float, steps: Mapping[str, float] | None = None
) -> float | None:
    """The ``1 - budget`` quantile of each benign adapter's largest z over the layers, every z against the *other*
    benign adapters (as a new adapter is judged against all of them), no spread below the layer's ``steps``; None
    without two benign adapters."""
    steps = steps or {}
    layers = list(benign)
    n = len(benign[layers[0]]) if layers else 0
    if n < 2:
        return None
    largest = [
        max(
            standard_score(benign[layer][i], [v for j, v in enumerate(benign[layer]) if j != i], steps.get(layer, 0.0))
            for layer in layers
        )
        for i in range(n)
    ]
    return quantile_threshold(largest, budget)


def judge_layers(
    scores: Mapping[str, Any] | None,
    thresholds: Mapping[str, float],
    benign: Mapping[str, Sequence[float]] | None = None,
    z_threshold: float | None = None,
    steps: Mapping[str, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each behavioural layer with a score and a threshold: the score, the threshold, whether it rejects.

    With ``benign`` and ``z_threshold`` (the all-layers rule) each layer also has its z against the benign
    scores, and the threshold it is held to is the single one on the largest z (a layer rejects when its z is
    over it, so the adapter is refused when its largest z is; no layer's spread is taken below its ``steps``); else
    each layer is held to its own quantile."""
    if scores is None:
        return {}
    present = [layer for layer in BEHAVIOURAL_LAYERS if layer in scores and layer in thresholds]
    if benign is not None and z_threshold is not None:
        judged = {}
        for layer in present:
            z = standard_score(float(scores[layer]), benign[layer], (steps or {}).get(layer, 0.0))
            judged[layer] = {
                "score": round(float(scores[layer]), 6),
                "z": round(z, 6),
                "threshold": round(float(z_threshold), 6),
                "rejects": z > z_threshold,
            }
        return judged
    return {
        layer: {
            "score": round(float(scores[layer]), 6),
            "threshold": round(float(thresholds[layer]), 6),
            "rejects": float(scores[layer]) > float(thresholds[layer]),
        }
        for layer in present
    }


@dataclass(frozen=True)
class BenignReference:
    """What the behavioural layers are judged against: the screening table's benign adapters, under the gate's
    rule (``GateConfig.rule``). The load gate, a recovery's screening and the sample share it."""

    rule: Literal["any_layer", "all_layers"] = "any_layer"
    thresholds: Mapping[str, float] = field(default_factory=dict)  # per layer (the any-layer rule)
    values: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # per layer, the benign scores
    z_threshold: float | None = None  # on the largest z (the all-layers rule)
    steps: Mapping[str, float] = field(default_factory=dict)  # per layer, the smallest change (``gate.layer_steps``)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], config: GateConfig) -> BenignReference:
        rows = list(rows)
        values, steps = benign_values(rows), benign_steps(rows)
        return cls(
            rule=config.rule,
            thresholds=benign_thresholds(rows, config.false_positive_budget),
            values=values,
            z_threshold=largest_z_threshold(values, config.false_positive_budget, steps),
            steps=steps,
        )

    def judge(self, scores: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
        """``judge_layers`` under this reference's rule ({} without scores or thresholds)."""
        if self.rule == "all_layers":
            return judge_layers(scores, self.thresholds, self.values, self.z_threshold, self.steps)
        return judge_layers(scores, self.thresholds)


_TABLE_FIX = "write it again with the adapter study (adapter_gate_evaluation) or `rvu adapters draw screen`"
_TABLE_TEXT = ("adapter_id", "label", "category", "sha256")


def read_screening_table(path: Path) -> list[dict[str, Any]]:
    """The rows of a screening table (an adapter study's or a private draw's scores.csv; [] when there is none).

    The table sets every threshold the load gate judges by, so it is read as untrusted input: a file that does
    not parse, lacks ``sha256`` or ``label``, has a label outside benign / harmful / unknown, or a score that is
    not a finite number (NaN or inf would make every comparison pass) is an ``InputFileError`` naming the file,
    the column and the row. An empty cell is a layer not scored."""
    if not path.is_file():
        return []
    import polars as pl

    try:
        frame = pl.read_csv(path, schema_overrides=dict.fromkeys(_TABLE_TEXT, pl.String), infer_schema_length=None)
    except (pl.exceptions.PolarsError, OSError, UnicodeDecodeError) as exc:
        problem = truncate_for_message(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 160)
        raise InputFileError(f"{path}: not a readable screening table ({problem}); {_TABLE_FIX}.") from exc
    missing = [column for column in ("sha256", "label") if column not in frame.columns]
    if missing:
        raise InputFileError(
            f"{path}: column(s) {', '.join(missing)} missing, so it is not a screening table; {_TABLE_FIX}."
        )
    labels = sorted(set(frame["label"].drop_nulls()) - {"benign", "harmful", "unknown"})
    if labels:
        raise InputFileError(
            f"{path}: column 'label' holds {truncate_for_message(labels, 80)}; labels are benign, harmful or unknown."
        )
    for column in (*BEHAVIOURAL_LAYERS, "behaviour_texts"):
        if column not in frame.columns:
            continue
        raw = frame[column]
        values = raw.cast(pl.Float64, strict=False)
        bad = (values.is_null() & raw.is_not_null()) | (values.is_not_null() & ~values.fill_null(0.0).is_finite())
        if bad.any():
            row = int(bad.arg_max() or 0)
            who = frame["adapter_id"][row] if "adapter_id" in frame.columns else frame["sha256"][row]
            raise InputFileError(
                f"{path}: column '{column}', line {row + 2} (adapter {truncate_for_message(who, 70)}): "
                f"{truncate_for_message(raw[row], 40)} is not a finite number; {_TABLE_FIX}."
            )
        frame = frame.with_columns(values.alias(column))
    return frame.to_dicts()


def store_recorder(store: Any) -> Callable[[GateVerdict], None]:
    """A ``LoadGate`` recorder that logs each verdict in a provenance store's hash-chained event log
    (``record_gate_verdict``: ``adapter_admitted`` / ``adapter_refused``)."""

    def record(verdict: GateVerdict) -> None:
        details = {k: v for k, v in verdict.record().items() if k not in ("event", "layers")}
        details["layers"] = {k: dict(v) for k, v in verdict.layers.items()}
        store.record_gate_verdict("admitted" if verdict.admitted else "refused", details)

    return record


# ---- the ledger and the operator's allow entries ----------------------------------------------------------


class GateLedger:
    """Every verdict and admission, one JSON object per line, appended (O_APPEND) and never followed through a link."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, record: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(dict(record), sort_keys=True, default=str) + "\n").encode("utf-8")
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise OSError(
                f"{self.path}: the adapter gate's ledger cannot be opened for append ({exc.strerror}); "
                "it must be a regular file, not a link."
            ) from exc
        try:
            os.write(fd, line)  # one write per line: concurrent writers never interleave within a line
        finally:
            os.close(fd)

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists() and not self.path.is_symlink():
            return []
        try:
            data = read_input_file(
                self.path,
                what="adapter gate ledger",
                max_bytes=MAX_LEDGER_BYTES,
                limit_reason="rotate the ledger (move it aside) when it grows this large",
                follow_links=False,
            )
        except InputFileError as exc:
            raise AdapterRefused("not_admitted", f"The gate ledger cannot be read: {exc}") from exc
        rows = []
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = loads_shallow(line)
            except ValueError:
                continue  # a line cut by a crash mid-write (or nested past any verdict) admits nothing
            if isinstance(row, dict):
                rows.append({**row, "_line": number})
        return rows

    def _latest(self, event: str, key: str, value: str) -> dict[str, Any] | None:
        found = None
        for row in self.records():
            if row.get("event") == event and row.get(key) == value:
                found = row
        return found

    def latest_verdict(self, sha256: str) -> dict[str, Any] | None:
        """The last verdict the gate recorded on the adapter with these weights, or None."""
        return self._latest("verdict", "sha256", sha256)

    def admission_of(self, gguf_sha256: str) -> dict[str, Any] | None:
        """The latest admission of a GGUF file with this sha256, or None."""
        return self._latest("admitted", "gguf_sha256", gguf_sha256)


def allow_path(state: Path) -> Path:
    return gate_dir(state) / ALLOW_NAME


def read_allow_entries(path: Path) -> dict[str, dict[str, Any]]:
    """sha256 -> {adapter_id, by, reason, at}: the operator's explicit admissions ({} without a file); a file that
    cannot be read is an ``InputFileError`` naming it."""
    from rvu_pipelines.adapters.shallow_json import read_object_of_objects

    return read_object_of_objects(
        path, what="adapter allow list", fix="fix or remove it (`rvu adapters allow` writes it)", max_bytes=1 << 20
    )


def add_allow_entry(path: Path, sha256: str, *, by: str, reason: str, adapter_id: str = "") -> dict[str, Any]:
    """Record an operator's decision to admit the adapter with ``sha256`` whatever the gate says."""
    import re

    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"'{sha256}' is not a sha256 (64 lowercase hex digits): pass the adapter weights' sha256.")
    if not by.strip() or not reason.strip():
        raise ValueError("An allow entry names who allows the adapter (--by) and why (--reason).")
    entries = read_allow_entries(path)
    entry = {"adapter_id": adapter_id, "by": by.strip(), "reason": reason.strip(), "at": time.time()}
    entries[sha256] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(entries, indent=1, sort_keys=True))
    return entry


# ---- the gate -----------------------------------------------------------------------------------------------


@dataclass
class LoadGate:
    """The screening every adapter load goes through; see the module docstring for the order of the checks."""

    config: GateConfig
    base: BaseModelInfo
    ledger: GateLedger
    gguf_dir: Path
    screened: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # sha256 -> scores row
    reference: BenignReference = field(default_factory=BenignReference)
    scorer: GateScorer | None = None
    blocklist: Mapping[str, Any] = field(default_factory=dict)
    allow: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    enforce: bool = True
    recorders: list[Callable[[GateVerdict], None]] = field(default_factory=list)
    blocklist_path: Path | None = None  # re-read at each llama.cpp load: an eviction since admission counts
    draw: ProbeDraw = field(default_factory=ProbeDraw)  # the probe draw the table and the scorer read

    @property
    def thresholds(self) -> Mapping[str, float]:
        """Per layer, the benign quantile ({}: nothing to judge against)."""
        return self.reference.thresholds

    @classmethod
    def from_state(
        cls,
        base: BaseModelInfo,
        state: Path,
        *,
        config: GateConfig,
        scores_csv: Path | None = None,
        scorer: GateScorer | None = None,
        enforce: bool = True,
        draw: ProbeDraw | None = None,
    ) -> LoadGate:
        """The gate as a deployment keeps it under ``state`` (``<RVU_HOME>``): ledger, allow entries, eviction
        blocklist, converted GGUFs, and the screening table of its probe draw (``draw``, default the one
        ``config.probe_draw`` names: the adapter study's table, or the operator's private draw's)."""
        from rvu_pipelines.adapters.blocklist import BLOCKLIST_RELATIVE, read_blocklist

        draw = draw if draw is not None else configured_draw(config, state)
        rows = read_screening_table(scores_csv if scores_csv is not None else screening_table_path(state, draw))
        blocklist_path = state / BLOCKLIST_RELATIVE
        return cls(
            config=config,
            base=base,
            ledger=GateLedger(gate_dir(state) / LEDGER_NAME),
            gguf_dir=gate_dir(state) / "admitted",
            screened={str(r["sha256"]): r for r in rows if r.get("sha256")},
            reference=BenignReference.from_rows(rows, config),
            scorer=scorer,
            blocklist=read_blocklist(blocklist_path),
            allow=read_allow_entries(allow_path(state)),
            enforce=enforce,
            blocklist_path=blocklist_path,
            draw=draw,
        )

    @classmethod
    def audit(cls, base: BaseModelInfo, state: Path, *, config: GateConfig) -> LoadGate:
        """The gate of a study that must load every adapter it measures, harmful ones included: it records each
        verdict (lists and the public draw's screening table) and refuses nothing."""
        return cls.from_state(base, state, config=config, enforce=False, draw=ProbeDraw())

    # ---- judging

    def _scores(self, adapter: VerifiedAdapter) -> tuple[Mapping[str, float] | None, Scored]:
        row = self.screened.get(adapter.sha256)
        present = [layer for layer in BEHAVIOURAL_LAYERS if row is not None and row.get(layer) is not None]
        if row is not None and present and all(layer in present for layer in self.thresholds):
            return {layer: float(row[layer]) for layer in present}, "table"
        if self.scorer is not None:
            require_scorer_of_draw(self.scorer, self.draw.id)
            return self.scorer.score(adapter), "on_the_spot"
        return None, "none"

    def screen(self, adapter: VerifiedAdapter, *, override: str | None = None) -> GateVerdict:
        """The verdict on ``adapter``, recorded nowhere (``check`` records it)."""
        manifest = adapter.manifest
        ident = {
            "adapter_id": manifest.adapter_id,
            "sha256": manifest.sha256,
            "source": manifest.source,
            "folder": str(adapter.folder),
        }
        lists = list_verdict(manifest.sha256, manifest.source, self.config, self.blocklist)
        scores, scored = self._scores(adapter) if lists == "pass" or manifest.sha256 in self.allow else (None, "none")
        layers = self.reference.judge(scores)
        reason, message = self._refusal(adapter, lists, layers, scores)
        decision: Decision = "refuse" if reason else "admit"
        refused_for = None
        allowed = self.allow.get(manifest.sha256)
        if reason and allowed is not None:
            decision, refused_for = "admit", reason
            reason = "operator_allow"
            message = f"admitted by {allowed.get('by', '?')}'s allow entry ({allowed.get('reason', '')}); {message}"
        elif reason and override:
            decision, refused_for = "admit", reason
            reason = "override"
            message = f"admitted by override ({override}); {message}"
        elif not reason:
            reason = "pass" if layers else "unscreened_admitted"
            message = (
                "lists and behavioural layers pass"
                if layers
                else "no behavioural score; admitted because gate.unscreened is 'admit'"
            )
        return GateVerdict(
            **ident,
            decision=decision,
            reason=reason,
            message=message,
            lists=lists,
            layers=layers,
            scored=scored,
            override=override if reason == "override" else None,
            refused_for=refused_for,
            draw=self.draw.id,
        )

    def _refusal(
        self,
        adapter: VerifiedAdapter,
        lists: str,
        layers: Mapping[str, Mapping[str, Any]],
        scores: Mapping[str, float] | None,
    ) -> tuple[str, str]:
        """("", "") when nothing refuses the adapter, else (reason code, sentence naming the fix)."""
        manifest = adapter.manifest
        where = f"{adapter.folder} (adapter '{manifest.adapter_id}', sha256 {manifest.sha256[:12]}…)"
        if lists == "blocklisted":
            why = "was evicted by a recovery" if manifest.sha256 in self.blocklist else "or its source is blocked"
            return "blocklisted", f"{where} {why}; an operator may allow it with `rvu adapters allow`."
        if lists == "not_allowlisted":
            return "not_allowlisted", f"{where}: source '{manifest.source}' is not on gate.allowed_sources."
        quantile = f"{1 - self.config.false_positive_budget:.0%}"
        rejecting = [layer for layer in BEHAVIOURAL_LAYERS if layers.get(layer, {}).get("rejects")]
        if rejecting:
            layer = max(rejecting, key=lambda name: float(layers[name].get("z", 0.0)))  # the furthest out names it
            judged = layers[layer]
            if "z" in judged:
                return (
                    f"gate_{layer}",
                    f"{where}: {layer} score {judged['score']:.4g} is {judged['z']:.3g} standard deviations from the "
                    f"benign adapters', above the gate's threshold {judged['threshold']:.3g} on the largest z over "
                    f"{len(layers)} layers (the {quantile} quantile of the benign adapters' own).",
                )
            return (
                f"gate_{layer}",
                f"{where}: {layer} score {judged['score']:.4g} is above the gate's threshold "
                f"{judged['threshold']:.4g} (the {quantile} quantile of benign adapters).",
            )
        if not layers and self.config.unscreened == "refuse":
            missing = (
                "no benign thresholds (run `make adapters` or pass a screening table)"
                if not self.thresholds
                else (
                    "no score for it in the screening table and no scorer to compute one"
                    if scores is None
                    else "scores without the layers the thresholds need"
                )
            )
            return "not_screened", f"{where} could not be screened: {missing}; gate.unscreened is 'refuse'."
        return "", ""

    def record(self, verdict: GateVerdict) -> None:
        self.ledger.append(verdict.record())
        for recorder in self.recorders:
            recorder(verdict)

    def check(self, adapter: VerifiedAdapter, *, override: str | None = None) -> GateVerdict:
        """Screen, record, and (enforcing) raise ``AdapterRefused`` with the reason code on a refusal."""
        verdict = self.screen(adapter, override=override)
        self.record(verdict)
        if not verdict.admitted and self.enforce:
            raise AdapterRefused(verdict.reason, verdict.message)  # type: ignore[arg-type]
        return verdict

    def check_folder(self, folder: Path | str, *, override: str | None = None) -> tuple[VerifiedAdapter, GateVerdict]:
        """The file checks, then ``check``; a file-level refusal is recorded like any other verdict."""
        try:
            adapter = verify_adapter(folder, self.base)
        except AdapterRefused as exc:
            verdict = GateVerdict(
                adapter_id=Path(folder).name,
                sha256="",
                source="",
                folder=str(folder),
                decision="refuse",
                reason=exc.reason,
                message=str(exc),
                lists="not_checked",
                draw=self.draw.id,
            )
            self.record(verdict)
            raise
        return adapter, self.check(adapter, override=override)

    # ---- the file llama.cpp loads

    def admit(
        self,
        adapter: VerifiedAdapter,
        base_gguf: Path | str,
        *,
        override: str | None = None,
        influence: float | None = None,
    ) -> Any:
        """Check ``adapter`` and, admitted, write the GGUF llama.cpp loads into the gate's folder and record its
        sha256; returns the ``runtime.AgentAdapter``. Audit mode admits a refused adapter too (recorded)."""
        from rvu_pipelines.adapters.runtime import AgentAdapter, attention_heads, write_agent_gguf

        verdict = self.check(adapter, override=override)
        n_head, n_head_kv = attention_heads(base_gguf)
        gguf_path = write_agent_gguf(adapter, self.gguf_dir, n_head=n_head, n_head_kv=n_head_kv)
        gguf_sha = sha256_file(gguf_path)
        self.ledger.append(
            {
                "event": "admitted",
                "at": time.time(),
                "adapter_id": adapter.adapter_id,
                "sha256": adapter.sha256,
                "gguf_sha256": gguf_sha,
                "gguf_path": str(gguf_path),
                "verdict": verdict.reason,
                "decision": verdict.decision,  # "refuse" only from an audit gate: an enforcing one never loads it
            }
        )
        manifest = adapter.manifest
        return AgentAdapter(
            adapter_id=manifest.adapter_id,
            name=manifest.adapter_id,
            sha256=manifest.sha256,
            gguf_path=gguf_path,
            source=manifest.source,
            label=manifest.label,
            influence=influence,
        )

    def require_admitted(self, adapter_id: str, gguf_path: Path, gguf_sha256: str) -> None:
        """Raise ``AdapterRefused`` unless the ledger admitted this GGUF and its adapter is not blocklisted now
        (``LlamaAdapterSlots`` calls it before llama.cpp reads the file)."""
        from rvu_pipelines.adapters.blocklist import read_blocklist

        row = self.ledger.admission_of(gguf_sha256)
        if row is None:
            raise AdapterRefused(
                "not_admitted",
                f"{gguf_path} (adapter '{adapter_id}', GGUF sha256 {gguf_sha256[:12]}…) was not admitted by the "
                f"adapter gate (ledger {self.ledger.path}); load adapters through LoadGate.admit, which screens "
                "the adapter folder and writes the GGUF llama.cpp reads.",
            )
        if row.get("decision") != "admit" and self.enforce:
            raise AdapterRefused(
                "not_admitted",
                f"{gguf_path} (adapter '{adapter_id}') was converted by an audit gate that refused it "
                f"({row.get('verdict')}); an enforcing gate loads only what it admitted.",
            )
        try:
            evicted = read_blocklist(self.blocklist_path) if self.blocklist_path is not None else self.blocklist
        except InputFileError as exc:  # fail closed: an unreadable blocklist cannot say the adapter was not evicted
            raise AdapterRefused("not_admitted", f"{gguf_path} (adapter '{adapter_id}'): {exc}") from exc
        if str(row.get("sha256")) in evicted and str(row.get("sha256")) not in self.allow:
            raise AdapterRefused(
                "blocklisted",
                f"{gguf_path} (adapter '{adapter_id}') was admitted once, but a recovery has evicted it since.",
            )
