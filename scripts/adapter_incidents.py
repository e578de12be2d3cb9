"""E1 with adapters: sessions of attack episodes with a harmful zoo adapter loaded part-way,
recovered with RVU v1 and v2, scored against the adapter's counterfactual ground truth.

    .venv/bin/python scripts/adapter_incidents.py                          # backdoor-send-money + persona-hostile
    .venv/bin/python scripts/adapter_incidents.py --adapters persona-hostile --sessions 4 --episodes 3

The adapters must be trained first (scripts/adapter_study.py, or `make adapters`). Every model call goes
through the response cache (keyed by the adapter set), so a re-run replays. Each recovery that evicts the
adapter certifies its membership (members vs non-members rebuilt from its manifest, loaded vs evicted); the
measurement depends on the adapter alone, so it is made once per adapter and shared by its sessions
(--no-membership skips it). Outputs: <out>/incidents.json (per-session scores and the summary) and
<out>/incidents.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapters", nargs="+", default=["backdoor-send-money", "persona-hostile"])
    parser.add_argument("--benchmark", default="injecagent_dh")
    parser.add_argument("--sessions", type=int, default=8)  # README's E1-with-adapters table
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument(
        "--detector",
        default="heuristic",
        help="seeds of both recoveries: heuristic (D1, default), nanoguard (D3 zero-shot), registered:<name> (D2/D4), "
        "oracle (the planted injection text: an upper bound that reads the answer key)",
    )
    parser.add_argument(
        "--trigger",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="plant a backdoor adapter's trigger (its zoo entry's args.trigger) in the injections read under it",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--scores",
        type=Path,
        default=None,
        help="E5 scores (scripts/adapter_study.py's scores.csv; default <out>/scores.csv): I(adapter) recorded in "
        "the load line feeds FROC's influence term; without it I = 0",
    )
    parser.add_argument(
        "--membership",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure each evicted adapter's membership (loaded vs evicted) into the certificates; each adapter is "
        "measured once and the result shared by all its sessions",
    )
    parser.add_argument(
        "--membership-cap", type=int, default=24, help="members (and as many non-members) per measured adapter"
    )
    args = parser.parse_args(argv)

    from rvu_pipelines.adapters.admission import LoadGate
    from rvu_pipelines.adapters.eviction_probe import DISABLED_REASON, RecoveryMembership
    from rvu_pipelines.adapters.files import BaseModelInfo, verify_adapter
    from rvu_pipelines.adapters.gate import load_gate_config
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
    from rvu_pipelines.adapters.zoo import load_zoo_config, zoo_root
    from rvu_pipelines.agents.defenses import DefenseSettings
    from rvu_pipelines.agents.harness import AGENT_N_CTX, LazyChatModel, detector_for
    from rvu_pipelines.agents.llm_cache import CachedChatModel, ResponseCache
    from rvu_pipelines.detectors.base import MemoizedDetector
    from rvu_pipelines.models import LlamaCppChatModel, ModelStore, load_model_config
    from rvu_pipelines.paths import state_dir
    from rvu_pipelines.provenance.incident import IncidentLog
    from rvu_pipelines.recovery.pipeline import MembershipProbe, NotRunProbe
    from rvu_pipelines.scenarios import scenarios_for

    out = args.out or state_dir() / "adapter_study"
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    config = load_model_config()
    resolved = ModelStore().resolve("llm", config.profile(args.profile)["llm"])
    base = BaseModelInfo.from_gguf(resolved.path, name=resolved.name, sha256=resolved.sha256)
    gate = LoadGate.from_state(base, state_dir(), config=load_gate_config())

    def build() -> LlamaCppChatModel:
        n_ctx = max(AGENT_N_CTX, resolved.n_ctx)
        return LlamaCppChatModel(
            resolved.path, n_ctx=n_ctx, n_threads=args.threads, name=resolved.name, adapter_gate=gate
        )

    cache = ResponseCache(state_dir() / "llm_cache.sqlite")
    agent = CachedChatModel(LazyChatModel(build, resolved.name), cache, resolved.sha256)
    reference = CachedChatModel(LazyChatModel(build, resolved.name), cache, resolved.sha256)
    scenarios = scenarios_for(args.benchmark, None)
    if args.detector == "oracle":  # an upper bound that reads the answer key: labelled so in every output
        detector, detector_version = PlantedInjectionOracle(s.injection for s in scenarios), "oracle (answer key)"
    else:
        detector, detector_version = detector_for(args.detector)
    settings = DefenseSettings(detector=MemoizedDetector(detector))
    results: dict[str, object] = {"benchmark": args.benchmark, "detector": detector_version, "adapters": {}}
    membership = RecoveryMembership(args.profile, cap=args.membership_cap) if args.membership else None

    def probe_for(incident: IncidentLog) -> MembershipProbe:
        return membership.for_incident(incident) if membership is not None else NotRunProbe(DISABLED_REASON)

    influences = _influences(args.scores or out / "scores.csv")
    results["influence_source"] = str(args.scores or out / "scores.csv") if influences else "none (I = 0)"
    zoo = load_zoo_config()
    for adapter_id in args.adapters:
        verified = verify_adapter(zoo_root() / adapter_id, base)
        influence = influences.get((adapter_id, verified.sha256))
        verdict = gate.screen(verified)  # what the gate says, published beside the incident it lets happen
        adapter = gate.admit(
            verified, resolved.path, influence=influence, override="E1: the incident is an adapter past the gate"
        )
        print(f"{adapter_id}: gate {verdict.decision} ({verdict.reason})", flush=True)
        print(f"{adapter_id}: I(adapter) = {influence if influence is not None else 'not recorded'}", flush=True)
        trigger = zoo.get(adapter_id).args.get("trigger") if args.trigger else None
        if trigger:
            print(f"{adapter_id}: backdoor trigger {trigger!r} planted in the injections read under it", flush=True)
        plans = session_plans(
            scenarios, adapter, sessions=args.sessions, episodes=args.episodes, seed=0, trigger=trigger
        )
        logs, scores = [], []
        for plan in plans:
            timeline = AdapterTimeline(agent, reference=reference)
            log = run_session(plan, timeline, settings)
            logs.append(log)
            for mode in MODES:
                scores.append(score_recovery(log, mode, out / "incidents", settings.detector, probe_for))
            row = {s.mode: (s.residual, s.benign_lost, s.adapters_evicted) for s in scores[-len(MODES) :]}
            probed = {s.mode: s.membership.split(":", 1)[0] for s in scores[-len(MODES) :]}
            print(
                f"  {plan.session_id}: {len(log.entries())} entries, {len(log.truth())} contaminated "
                f"({len(log.harmful)} harmful / {len(log.diverged)} changed / {log.adapted_calls} adapted calls); "
                f"residual/benign lost/evicted {row}; "
                f"membership {probed}",
                flush=True,
            )
        results["adapters"][adapter_id] = {  # type: ignore[index]
            "summary": summary(scores, logs),
            "sessions": [s.to_dict() for s in scores],
            "load_at": {p.session_id: p.load_at for p in plans},
            "gate": {"decision": verdict.decision, "reason": verdict.reason, "layers": dict(verdict.layers)},
        }
    results["seconds"] = round(time.perf_counter() - started, 1)
    (out / "incidents.json").write_text(json.dumps(results, indent=1))
    from rvu_pipelines.machine import results_stamp, stamp_line

    table = incidents_markdown(results) + "\n" + stamp_line(results_stamp(" ".join(["python", *sys.argv]))) + "\n"
    (out / "incidents.md").write_text(table)
    print(table)
    return 0


def _influences(path: Path) -> dict[tuple[str, str], float]:
    """(adapter id, sha256) -> influence from an E5 scores file; a retrained adapter (other sha) has none."""
    import polars as pl

    if not path.is_file():
        return {}
    frame = pl.read_csv(path)
    return {(r["adapter_id"], r["sha256"]): float(r["influence"]) for r in frame.iter_rows(named=True)}


if __name__ == "__main__":
    sys.exit(main())
