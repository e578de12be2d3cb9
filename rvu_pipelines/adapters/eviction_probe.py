"""The recovery's membership probe: every adapter a recovery evicted, measured loaded vs evicted on its own data.

``EvictedAdaptersProbe`` (recovery's ``MembershipProbe``) runs after the tiers. For each adapter the store
says this recovery evicted (the ``evicted`` events of its incident) it finds the adapter's files (the folder
the load gate's ledger recorded, else ``<root>/<adapter id>``; verified, and kept only with the sha256 the log
names), rebuilds members and non-members from the adapter's manifest (``membership_sets``) and scores them
with the adapter loaded and after eviction (``eviction.membership_before_after``). The adapters the incident
loaded but this recovery did not evict are listed with that reason. Whatever is not measured says why, so the
signed section never reads "not run" without one.

The de-quantised base model is loaded only when an adapter is actually measured, and each adapter is measured
once per probe family (``RecoveryMembership``): E1 recovers many sessions that evict the same adapter, and
the measurement depends on the adapter and the base, not on the session. The probe loads harmful adapters on
purpose, through an audit gate whose verdicts go to a ledger of their own (``PROBE_LEDGER_NAME``), so the
load gate's ledger keeps saying what was admitted when the agent loaded the adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rvu_pipelines.adapters.admission import LEDGER_NAME, GateLedger, LoadGate, gate_dir
from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import BaseModelInfo, VerifiedAdapter
from rvu_pipelines.adapters.membership_sets import DEFAULT_CAP, MembershipSet, MembersOf, zoo_membership_set
from rvu_pipelines.adapters.recovery_gate import AdapterRef, FilesOf, adapter_files
from rvu_pipelines.errors import RvuError

if TYPE_CHECKING:
    from rvu_pipelines.adapters.host import AdapterHost
    from rvu_pipelines.adapters.lingering import LingeringStores
    from rvu_pipelines.provenance.incident import IncidentLog
    from rvu_pipelines.provenance.store import AdapterRow, ProvenanceStore
    from rvu_pipelines.recovery.pipeline import MembershipProbe

PROBE_LEDGER_NAME = "membership_probe_ledger.jsonl"
DISABLED_REASON = "disabled by --no-membership"
# what measuring one adapter may raise and the certificate reports instead of failing the recovery
MEASURE_ERRORS = (AdapterRefused, RvuError, OSError, ValueError, RuntimeError)


def not_run(reason: str, **extra: Any) -> dict[str, Any]:
    return {"status": "not run", "reason": reason, **extra}


def worst_verdict(verdicts: Iterable[str]) -> str:
    """``residual`` over ``inconclusive`` over ``clean``: one leaking path makes the eviction incomplete."""
    found = set(verdicts)
    return next(v for v in ("residual", "inconclusive", "clean") if v in found)


class EvictedAdaptersProbe:
    """``recovery.pipeline.MembershipProbe`` over every adapter the recovery of ``incident_id`` evicted.

    ``files`` finds and verifies an adapter's folder (``recovery_gate.adapter_files``); ``host`` returns the
    ``AdapterHost`` to measure on, called only when an adapter is measured; ``members`` gives an adapter's
    members and non-members or the reason it cannot. Without ``incident_id`` every adapter the store marks
    evicted is measured. ``measured`` (sha256 -> section) may be shared by probes of one family.
    """

    def __init__(
        self,
        files: FilesOf | None,
        host: Callable[[], AdapterHost],
        *,
        members: MembersOf = zoo_membership_set,
        incident_id: str | None = None,
        named: Sequence[str] = (),
        ledger: GateLedger | None = None,
        probes: bool = False,
        n_boot: int = 1000,
        measured: dict[str, dict[str, Any]] | None = None,
        lingering: LingeringStores | None = None,
    ) -> None:
        self.files, self.host, self.members = files, host, members
        self.incident_id, self.named, self.ledger = incident_id, list(named), ledger
        self.probes, self.n_boot = probes, n_boot
        self.measured = measured if measured is not None else {}
        self.lingering = lingering

    def evicted(self, store: ProvenanceStore) -> tuple[list[AdapterRow], dict[str, str]]:
        """The adapters this recovery evicted, and (adapter id -> incident) those an earlier recovery evicted."""
        rows = [row for row in store.adapters() if row.purged]
        if self.incident_id is None:
            return rows, {}
        by: dict[int, str] = {}
        for event in store.events("evicted"):
            for seq in event.subjects:
                by.setdefault(int(seq), str(event.details.get("incident_id", "?")))
        mine = [row for row in rows if by.get(row.seq) == self.incident_id]
        earlier = {row.adapter_id: by.get(row.seq, "?") for row in rows if by.get(row.seq) != self.incident_id}
        return mine, earlier

    def run(self, store: ProvenanceStore, purged_entry_ids: Sequence[str]) -> dict[str, Any]:
        evicted, earlier = self.evicted(store)
        adapters = {row.adapter_id: self.measure(row, store) for row in evicted}
        for adapter_id in self.named:
            if adapter_id in adapters:
                continue
            if adapter_id in earlier:
                adapters[adapter_id] = not_run(
                    f"evicted by an earlier recovery (incident {earlier[adapter_id]}); its certificate carries the "
                    "measurement or the reason there is none"
                )
            else:
                adapters[adapter_id] = not_run("this recovery did not evict it: nothing to verify")
        section: dict[str, Any] = {"adapters": adapters}
        ran = [result for result in adapters.values() if result["status"] == "run"]
        if ran:
            section["status"] = "run"
            section["verdict"] = worst_verdict(r["verdict"] for r in ran)
        elif not evicted:
            section.update(not_run("this recovery evicted no adapter"))
        else:
            section.update(not_run("no evicted adapter could be measured; each one's reason is under adapters"))
        return section

    def measure(self, row: AdapterRef, store: ProvenanceStore | None = None) -> dict[str, Any]:
        """One evicted adapter's section: the before/after report, or why there is none. With ``lingering`` and
        the ``store``, also the members against the texts it left at rest (``at_rest``), whose verdict counts."""
        sha = str(row.adapter_hash or "")
        fused = bool(getattr(row, "fused", False))  # measured as it ran: merged into the weights, then un-merged
        memo = f"{sha}+fused" if fused else sha
        if memo in self.measured and (self.lingering is None or store is None):
            return self.measured[memo]
        if self.files is None:
            return not_run("no way to find adapter files was given to the probe", sha256=sha)
        try:
            ledger_row = self.ledger.latest_verdict(sha) if self.ledger is not None and sha else None
        except AdapterRefused:  # an unreadable ledger: the adapter roots may still hold the files
            ledger_row = None
        try:
            adapter = self.files(row, ledger_row)
        except AdapterRefused as exc:
            return not_run(f"its files fail the file checks ({exc.reason}): {exc}", sha256=sha, code=exc.reason)
        except (RvuError, OSError) as exc:  # e.g. the base model the files must fit cannot be resolved
            return not_run(f"its files could not be checked: {exc}", sha256=sha)
        if adapter is None:
            return not_run(
                f"its files are not at hand: no folder with weights of sha256 {sha[:12]}… where the load gate's "
                "ledger or the adapter roots would hold it",
                sha256=sha,
            )
        membership = self.members(adapter)
        if isinstance(membership, str):
            return not_run(f"its training data cannot be rebuilt: {membership}", sha256=sha)
        if memo not in self.measured:
            try:
                self.measured[memo] = self._before_after(adapter, membership, fused=fused)
            except MEASURE_ERRORS as exc:
                return not_run(f"measuring it failed ({type(exc).__name__}): {exc}", sha256=sha)
        section = self.measured[memo]
        if self.lingering is None or store is None:
            return section
        from rvu_pipelines.adapters.lingering import at_rest_leak, at_rest_texts

        seq = int(getattr(row, "seq", -1))
        texts = at_rest_texts(self.lingering, self.lingering.gguf_files(sha), store, seq)
        rest = at_rest_leak(membership.examples, membership.is_member, texts, n_boot=self.n_boot).to_dict()
        return {**section, "at_rest": rest, "verdict": worst_verdict([section["verdict"], rest["verdict"]])}

    def _before_after(self, adapter: VerifiedAdapter, membership: MembershipSet, *, fused: bool) -> dict[str, Any]:
        from rvu_pipelines.adapters.eviction import membership_before_after
        from rvu_pipelines.adapters.zoo import encoder_of

        result = membership_before_after(
            self.host(),
            adapter,
            membership.examples,
            membership.is_member,
            probes=self.probes,
            n_boot=self.n_boot,
            fused=fused,
            encoder=encoder_of(membership.encoder),
            max_tokens=membership.max_tokens,
        )
        section = {**result.certificate_section(), "sha256": adapter.sha256, "membership_set": membership.origin}
        return {**section, "fused": True} if fused else section


class RecoveryMembership:
    """The probes of the recovery entry points (``rvu recover``, ``incident_recovery``, E1): one model profile's
    base, resolved from its GGUF on the first adapter whose files are checked and de-quantised on the first one
    measured, and the measurements made so far, shared by every incident's probe. ``members`` replaces the zoo
    as the source of members (an adapter trained outside the zoo whose training data its caller knows)."""

    def __init__(
        self,
        profile: str | None = None,
        *,
        cap: int = DEFAULT_CAP,
        probes: bool = False,
        n_boot: int = 1000,
        roots: Sequence[Path] | None = None,
        state: Path | None = None,
        members: MembersOf | None = None,
        lingering: LingeringStores | None = None,
    ) -> None:
        self.profile, self.cap, self.probes, self.n_boot = profile, cap, probes, n_boot
        self.members: MembersOf = members or partial(zoo_membership_set, cap=cap)
        self._roots, self._state = roots, state
        self.lingering = lingering  # the runtime's stores: each measured adapter's texts at rest are probed too
        self._resolved: Any = None
        self._base: BaseModelInfo | None = None
        self._host: AdapterHost | None = None
        self.measured: dict[str, dict[str, Any]] = {}

    @property
    def host_loaded(self) -> bool:
        """Whether the de-quantised base was loaded (only an adapter actually measured loads it)."""
        return self._host is not None

    @property
    def state(self) -> Path:
        from rvu_pipelines.paths import state_dir

        return self._state if self._state is not None else state_dir()

    def base(self) -> BaseModelInfo:
        """What the adapters must fit, from the profile's agent GGUF (as ``gate_for_incident`` reads it)."""
        if self._base is None:
            from rvu_pipelines.models import ModelStore, load_model_config

            self._resolved = ModelStore().resolve("llm", load_model_config().profile(self.profile)["llm"])
            resolved = self._resolved
            self._base = BaseModelInfo.from_gguf(resolved.path, name=resolved.name, sha256=resolved.sha256)
        return self._base

    def files(self, adapter: AdapterRef, ledger_row: Mapping[str, Any] | None) -> VerifiedAdapter | None:
        from rvu_pipelines.adapters.zoo import zoo_root

        roots = list(self._roots) if self._roots is not None else [zoo_root()]
        return adapter_files(self.base(), roots)(adapter, ledger_row)

    def host(self) -> AdapterHost:
        """The de-quantised base behind an audit gate that records to the probe's own ledger."""
        if self._host is None:
            from rvu_pipelines.adapters.gate import load_gate_config
            from rvu_pipelines.adapters.host import AdapterHost
            from rvu_pipelines.models.dequantized import load_dequantized

            base = self.base()
            model, tokenizer = load_dequantized(
                self._resolved.path, sha256=self._resolved.sha256, attn_implementation="sdpa"
            )
            gate = LoadGate.audit(base, self.state, config=load_gate_config())
            gate = replace(gate, ledger=GateLedger(gate_dir(self.state) / PROBE_LEDGER_NAME))
            self._host = AdapterHost(model, tokenizer, gate=gate)
        return self._host

    def for_incident(self, incident: IncidentLog) -> EvictedAdaptersProbe:
        return EvictedAdaptersProbe(
            self.files,
            self.host,
            members=self.members,
            incident_id=incident.incident_id,
            named=[record.adapter_id for record in incident.adapters_loaded if record.adapter_id],
            ledger=GateLedger(gate_dir(self.state) / LEDGER_NAME),
            probes=self.probes,
            n_boot=self.n_boot,
            measured=self.measured,
            lingering=self.lingering,
        )


def probe_for_incident(
    incident: IncidentLog,
    profile: str | None = None,
    *,
    enabled: bool = True,
    reason: str = DISABLED_REASON,
    lingering: LingeringStores | None = None,
) -> MembershipProbe:
    """The probe ``rvu recover`` and the ``incident_recovery`` asset pass: every adapter the recovery evicts,
    measured (and, with ``lingering``, what it left at rest on the runtime); disabled, a "not run" section with
    ``reason``."""
    from rvu_pipelines.recovery.pipeline import NotRunProbe

    if not enabled:
        return NotRunProbe(reason)
    return RecoveryMembership(profile, lingering=lingering).for_incident(incident)
