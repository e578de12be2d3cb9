"""The adapter gate as the recovery pipeline asks for it: what each adapter of an incident was judged, and on
what evidence.

``ScreeningGate`` implements ``recovery.pipeline.AdapterGate``: for every adapter an incident names (loaded or
refused) the certificate's ``adapter_attestation`` carries

- ``lists``: layer 1 on the log line itself (sha256 and source against ``configs/adapters.yaml gate:`` plus the
  eviction blocklist);
- ``at_load``: the verdict the load gate recorded in its ledger when the adapter was offered (decision, reason,
  layer scores), or why there is none;
- ``behaviour``: layers 2-3 judged now against the ``1 - false_positive_budget`` quantile of the *benign*
  adapters of the screening table of the gate's probe draw (``probe_draw.screening_table_path``: the adapter
  study's ``<RVU_HOME>/adapter_study/scores.csv``, or the operator's private draw's): the table's row for the
  sha256, else, when the adapter's files are at hand (the folder the ledger names, or the zoo), scored at recovery
  time by the gate's scorer on the same draw. Only when neither is possible is it "not screened", with the reason;
  ``draw`` names the draw (its id, never its seed).

Evicted adapters reach layer 1 through ``adapters.blocklist``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from rvu_pipelines.adapters.admission import BenignReference, GateLedger, GateScorer, require_scorer_of_draw
from rvu_pipelines.adapters.blocklist import read_blocklist
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import VerifiedAdapter
from rvu_pipelines.adapters.gate import GateConfig, list_verdict, load_gate_config
from rvu_pipelines.adapters.probe_draw import PUBLIC, ProbeDraw, configured_draw, screening_table_path
from rvu_pipelines.errors import InputFileError
from rvu_pipelines.provenance.incident import IncidentRecord


class AdapterRef(Protocol):
    """What names an adapter on disk: an incident's load line, or the store's adapter row."""

    @property
    def adapter_id(self) -> str | None: ...

    @property
    def adapter_hash(self) -> str | None: ...


FilesOf = Callable[[AdapterRef, Mapping[str, Any] | None], VerifiedAdapter | None]
AT_LOAD_FIELDS = ("decision", "reason", "scored", "layers", "at", "override", "refused_for", "draw")


class ScreeningGate:
    """``recovery.pipeline.AdapterGate`` from the gate lists, the eviction blocklist and an E4 screening table."""

    name = "rvu-adapter-gate"

    def __init__(
        self,
        config: GateConfig | None = None,
        screened: Iterable[Mapping[str, Any]] = (),
        *,
        blocklist: Mapping[str, Mapping[str, Any]] | None = None,
        ledger: GateLedger | None = None,
        files: FilesOf | None = None,
        scorer: GateScorer | None = None,
        draw: str = PUBLIC,
        unscreened_reason: str = "",
    ) -> None:
        """``unscreened_reason``: why there is no table to judge against, when that is known (said in place of the
        generic reason in every adapter's section)."""
        if scorer is not None:
            require_scorer_of_draw(scorer, draw)
        self.draw = draw
        self.config = config or load_gate_config()
        rows = [dict(r) for r in screened]
        self.screened = {str(r["sha256"]): r for r in rows}
        self.reference = BenignReference.from_rows(rows, self.config)
        self.blocklist = dict(read_blocklist() if blocklist is None else blocklist)
        self.ledger = ledger
        self.files = files
        self.scorer = scorer
        self.unscreened_reason = unscreened_reason

    @property
    def thresholds(self) -> Mapping[str, float]:
        """Per layer, the benign quantile ({}: no screening table with benign adapters)."""
        return self.reference.thresholds

    def _at_load(self, sha: str) -> tuple[dict[str, Any] | None, Mapping[str, Any] | None]:
        """(the certificate's view of the load-time verdict or why there is none, the raw ledger row)."""
        if self.ledger is None:
            return {"status": "no ledger", "reason": "this recovery was given no load-gate ledger"}, None
        try:
            row = self.ledger.latest_verdict(sha) if sha else None
        except AdapterRefused as exc:  # a ledger that is a link, or too large: said, and the recovery goes on
            return {"status": "unreadable", "reason": str(exc)}, None
        if row is None:
            # the file's name, not its path: a certificate's body holds no machine-specific path
            return {
                "status": "none",
                "reason": f"the ledger {self.ledger.path.name} has no verdict on this sha256",
            }, None
        return {k: row[k] for k in AT_LOAD_FIELDS if k in row}, row

    def _behaviour(self, adapter: IncidentRecord, sha: str, ledger_row: Mapping[str, Any] | None) -> dict[str, Any]:
        row = self.screened.get(sha)
        if not self.thresholds:
            reason = self.unscreened_reason or "no screening table with benign adapters to set thresholds"
            return {"status": "not screened", "reason": reason}
        if row is not None:
            return {"status": "screened", "scored": "table", "layers": self.reference.judge(row)}
        verified = None
        if self.files is not None:
            try:
                verified = self.files(adapter, ledger_row)
            except AdapterRefused as exc:
                return {"status": "not screened", "reason": f"its files fail the file checks ({exc.reason}): {exc}"}
        if verified is None:
            return {"status": "not screened", "reason": "no screening-table row and its files are not at hand"}
        if self.scorer is None:
            return {"status": "not screened", "reason": "its files are at hand but no scorer was given"}
        try:
            scores = self.scorer.score(verified)
        except (AdapterRefused, OSError) as exc:  # e.g. the zoo's refusal reference is not on this machine
            return {"status": "not screened", "reason": f"scoring at recovery failed: {exc}"}
        return {"status": "screened", "scored": "at_recovery", "layers": self.reference.judge(scores)}

    def screen(self, adapter: IncidentRecord) -> dict[str, Any]:
        sha, source = adapter.adapter_hash or "", adapter.source or "local"
        at_load, ledger_row = self._at_load(sha)
        result: dict[str, Any] = {
            "sha256": sha,
            "source": source,
            "lists": list_verdict(sha, source, self.config, self.blocklist),
            "at_load": at_load,
            "draw": self.draw,
        }
        behaviour = self._behaviour(adapter, sha, ledger_row)
        result["behaviour"] = behaviour.get("layers", "not screened")
        if behaviour["status"] != "screened":
            result["behaviour_reason"] = behaviour["reason"]
        else:
            result["scored"] = behaviour["scored"]
        rejected = result["lists"] != "pass" or any(v["rejects"] for v in behaviour.get("layers", {}).values())
        result["verdict"] = "refuse" if rejected else ("pass" if behaviour["status"] == "screened" else "unknown")
        return result


def adapter_files(base: Any, roots: Iterable[Path]) -> FilesOf:
    """Finds an incident's adapter on disk: the folder the ledger recorded for it, else ``<root>/<adapter id>``
    for each root; verified (``files.verify_adapter``) and kept only when its sha256 is the one the log names.
    The id comes from the incident log, so it is used as a folder name only when it is an adapter id (no
    separator, no ``..``): a log cannot point the lookup outside the roots."""
    import re

    from rvu_pipelines.adapters.files import verify_adapter
    from rvu_pipelines.adapters.manifest import ADAPTER_ID

    def find(adapter: AdapterRef, ledger_row: Mapping[str, Any] | None) -> VerifiedAdapter | None:
        candidates = [Path(str(ledger_row["folder"]))] if ledger_row and ledger_row.get("folder") else []
        if re.fullmatch(ADAPTER_ID, str(adapter.adapter_id)):
            candidates += [Path(root) / str(adapter.adapter_id) for root in roots]
        for folder in candidates:
            if (folder / "manifest.json").is_file():
                verified = verify_adapter(folder, base)
                if verified.sha256 == adapter.adapter_hash:
                    return verified
        return None

    return find


def default_gate(base: Any = None, scorer: GateScorer | None = None, draw: ProbeDraw | None = None) -> ScreeningGate:
    """The gate ``rvu recover`` and the ``incident_recovery`` asset pass: configs/adapters.yaml's lists, the
    eviction blocklist, the load gate's ledger and the adapter study's screening table
    (``<RVU_HOME>/adapter_study/scores.csv``, written by ``make adapters``, or the private draw's that
    ``gate.probe_draw`` names) where it exists; with ``base`` (``files.BaseModelInfo``) the adapters' files are
    looked up and verified, with ``scorer`` (of the same draw) scored."""
    from rvu_pipelines.adapters.admission import LEDGER_NAME, gate_dir, read_screening_table
    from rvu_pipelines.adapters.zoo import zoo_root
    from rvu_pipelines.paths import state_dir

    state, config = state_dir(), load_gate_config()
    ledger = GateLedger(gate_dir(state) / LEDGER_NAME)
    if draw is None:
        try:
            draw = configured_draw(config, state)
        except InputFileError:
            return _no_draw_gate(config, ledger)
    try:
        rows = read_screening_table(screening_table_path(state, draw))
    except InputFileError:
        return _no_draw_gate(config, ledger, draw=draw.id)
    return ScreeningGate(
        config,
        rows,
        ledger=ledger,
        files=adapter_files(base, [zoo_root()]) if base is not None else None,
        scorer=scorer,
        draw=draw.id,
    )


def gate_for_incident(incident: Any, profile: str | None = None) -> ScreeningGate:
    """``default_gate`` with the files and the scorer an incident that names adapters needs: the base is read
    from the profile's agent GGUF, and the scorer loads its model only if an adapter must be scored."""
    if not (incident.adapters_loaded or getattr(incident, "adapters_refused", [])):
        return default_gate()
    from rvu_pipelines.adapters.draw_scoring import LazyLabScorer
    from rvu_pipelines.adapters.files import BaseModelInfo
    from rvu_pipelines.models import ModelStore, load_model_config
    from rvu_pipelines.paths import state_dir

    config = load_model_config()
    name = config.profile_name(profile)  # one profile for the base and the scorer's model
    resolved = ModelStore().resolve("llm", config.profile(name)["llm"])
    base = BaseModelInfo.from_gguf(resolved.path, name=resolved.name, sha256=resolved.sha256)
    try:
        draw = configured_draw(load_gate_config(), state_dir())
    except InputFileError:
        return default_gate()  # says in each adapter's section that the draw is unavailable
    return default_gate(base, LazyLabScorer(name, draw=draw), draw)


def _no_draw_gate(config: GateConfig, ledger: GateLedger, *, draw: str | None = None) -> ScreeningGate:
    """The gate of a recovery whose configured private draw (``draw`` None) or whose draw's screening table cannot
    be read: the lists and the load-time verdicts still go into the certificate, the behavioural layers are "not
    screened" with the reason (no path: a certificate's body holds nothing machine-specific), and the recovery
    itself goes on."""
    if draw is None:
        reason = "gate.probe_draw is 'private' but its secret is missing or refused; `rvu adapters draw show` says why"
    else:
        reason = (
            "the probe draw's screening table is unreadable or holds a non-finite score; "
            "`rvu adapters draw show` says why"
        )
    return ScreeningGate(config, [], ledger=ledger, draw=draw or "unavailable", unscreened_reason=reason)
