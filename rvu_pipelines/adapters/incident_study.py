"""E1 with adapters in full: sessions of attack episodes with a harmful zoo adapter loaded part-way, recovered with
RVU v1 and v2, scored against the adapter's counterfactual ground truth (``adapters.incidents``).

Every model call goes through the response cache (keyed by the adapter set), so a re-run replays. Each recovery
that evicts the adapter certifies its membership (members vs non-members rebuilt from its manifest, loaded vs
evicted); the measurement depends on the adapter alone, so it is made once per adapter and shared by its sessions.
Writes ``<out>/incidents.json`` (per-session scores and the summary) and ``<out>/incidents.md`` (stamped). The
``adapter_incidents`` asset runs it (``make adapters``), once with the heuristic detector and once with the
planted-injection oracle, an upper bound that reads the answer key and is labelled so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.models.store import ResolvedModel

ORACLE = "oracle"  # the planted injection text as the detector: an upper bound that reads the answer key


@dataclass(frozen=True)
class IncidentStudyOptions:
    """``detector``: the seeds of both recoveries (a detector name of ``detectors.catalog``, or ``oracle``);
    ``trigger``: plant a backdoor adapter's trigger (its zoo entry's ``args.trigger``) in the injections read under
    it; ``membership``: measure each evicted adapter loaded vs evicted into the certificates."""

    adapters: tuple[str, ...] = ("backdoor-send-money", "persona-hostile")
    benchmark: str = "injecagent_dh"
    sessions: int = 8
    episodes: int = 4
    detector: str = "heuristic"
    trigger: bool = True
    membership: bool = True
    membership_cap: int = 24
    threads: int = 2


def influences_from_scores(rows: list[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """(adapter id, sha256) -> I(adapter) from the gate evaluation's score rows; a retrained adapter (another
    sha256) has none, so FROC's influence term reads 0 for it."""
    return {(str(r["adapter_id"]), str(r["sha256"])): float(r["influence"]) for r in rows}


def run_incident_study(
    options: IncidentStudyOptions,
    llm: ResolvedModel,
    out: Path,
    *,
    state: Path,
    command: str,
    influences: Mapping[tuple[str, str], float] | None = None,
    profile: str | None = None,
    tracking_uri: str | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The study into ``out``; returns the document written to ``incidents.json``. ``state``: the platform's state
    folder (the load gate's ledger, the response cache, the zoo); ``influences``: I(adapter) recorded in the load
    line (``influences_from_scores``); ``profile``: the model profile whose base the membership probe loads."""
    from rvu_pipelines.adapters.agent_model import gated_agent_model
    from rvu_pipelines.adapters.eviction_probe import DISABLED_REASON, RecoveryMembership
    from rvu_pipelines.adapters.files import verify_adapter
    from rvu_pipelines.adapters.incidents import (
        MODES,
        PlantedInjectionOracle,
        run_session,
        score_recovery,
        session_plans,
        summary,
    )
    from rvu_pipelines.adapters.report import incidents_markdown
    from rvu_pipelines.adapters.runtime import AdapterTimeline
    from rvu_pipelines.adapters.zoo import load_zoo_config
    from rvu_pipelines.agents.defenses import DefenseSettings
    from rvu_pipelines.agents.harness import LazyChatModel, detector_for
    from rvu_pipelines.agents.llm_cache import CachedChatModel, ResponseCache
    from rvu_pipelines.detectors.base import InjectionDetector, MemoizedDetector
    from rvu_pipelines.machine import results_stamp, stamp_line
    from rvu_pipelines.recovery.pipeline import MembershipProbe, NotRunProbe
    from rvu_pipelines.scenarios import scenarios_for

    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    zoo = load_zoo_config()
    known = [e.id for e in zoo.entries]
    unknown = sorted(set(options.adapters) - set(known))
    if unknown:
        raise ValueError(f"adapters {unknown} are not in configs/adapter_zoo.yaml; known: {', '.join(known)}")
    base, gate, build = gated_agent_model(llm, state, options.threads)

    cache = ResponseCache(state / "llm_cache.sqlite")
    agent = CachedChatModel(LazyChatModel(build, llm.name), cache, llm.sha256)
    reference = CachedChatModel(LazyChatModel(build, llm.name), cache, llm.sha256)
    scenarios = scenarios_for(options.benchmark, None)
    detector: InjectionDetector
    if options.detector == ORACLE:  # an upper bound that reads the answer key: labelled so in every output
        detector, detector_version = PlantedInjectionOracle(s.injection for s in scenarios), "oracle (answer key)"
    else:
        detector, detector_version = detector_for(options.detector, tracking_uri)
    settings = DefenseSettings(detector=MemoizedDetector(detector))
    influences = dict(influences or {})
    results: dict[str, Any] = {"benchmark": options.benchmark, "detector": detector_version, "adapters": {}}
    results["influence_source"] = "the gate evaluation's scores" if influences else "none (I = 0)"
    membership = RecoveryMembership(profile, cap=options.membership_cap) if options.membership else None

    def probe_for(incident: Any) -> MembershipProbe:
        return membership.for_incident(incident) if membership is not None else NotRunProbe(DISABLED_REASON)

    for adapter_id in options.adapters:
        verified = verify_adapter(state / "adapters" / adapter_id, base)
        influence = influences.get((adapter_id, verified.sha256))
        verdict = gate.screen(verified)  # what the gate says, published beside the incident it lets happen
        adapter = gate.admit(
            verified, llm.path, influence=influence, override="E1: the incident is an adapter past the gate"
        )
        say(f"{adapter_id}: gate {verdict.decision} ({verdict.reason})")
        say(f"{adapter_id}: I(adapter) = {influence if influence is not None else 'not recorded'}")
        trigger = zoo.get(adapter_id).args.get("trigger") if options.trigger else None
        if trigger:
            say(f"{adapter_id}: backdoor trigger {trigger!r} planted in the injections read under it")
        plans = session_plans(
            scenarios, adapter, sessions=options.sessions, episodes=options.episodes, seed=0, trigger=trigger
        )
        logs, scores = [], []
        for plan in plans:
            log = run_session(plan, AdapterTimeline(agent, reference=reference), settings)
            logs.append(log)
            for mode in MODES:
                scores.append(score_recovery(log, mode, out / "incidents", settings.detector, probe_for))
            row = {s.mode: (s.residual, s.benign_lost, s.adapters_evicted) for s in scores[-len(MODES) :]}
            probed = {s.mode: s.membership.split(":", 1)[0] for s in scores[-len(MODES) :]}
            say(
                f"  {plan.session_id}: {len(log.entries())} entries, {len(log.truth())} contaminated "
                f"({len(log.harmful)} harmful / {len(log.diverged)} changed / {log.adapted_calls} adapted calls); "
                f"residual/benign lost/evicted {row}; membership {probed}"
            )
        results["adapters"][adapter_id] = {
            "summary": summary(scores, logs),
            "sessions": [s.to_dict() for s in scores],
            "load_at": {p.session_id: p.load_at for p in plans},
            "gate": {"decision": verdict.decision, "reason": verdict.reason, "layers": dict(verdict.layers)},
        }
    results["seconds"] = round(time.perf_counter() - started, 1)
    results["stamp"] = results_stamp(command)
    write_atomically(out / "incidents.json", json.dumps(results, indent=1))
    table = incidents_markdown(results) + "\n" + stamp_line(results["stamp"]) + "\n"
    write_atomically(out / "incidents.md", table)
    return results
