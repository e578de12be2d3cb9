"""One episode of the attack table: a scenario through one defense, recorded, recovered, certified.

:func:`run_episode` never raises for a scenario that crashes: the episode becomes an error row, so a
cell of many episodes never loses the others. Its row (:meth:`EpisodeResult.to_row`) is flat and
JSON-able, as the cell files store it. LLM call counts are the caller's (from its CachedChatModel).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rvu_pipelines.agents.defenses import RECOVERING_DEFENSES, DefenseSettings, build_pipeline
from rvu_pipelines.agents.provenance_log import contaminated_count, episode_records, write_incident
from rvu_pipelines.models.llm import ChatModel
from rvu_pipelines.recovery.certificate import verify_certificate
from rvu_pipelines.recovery.pipeline import ClosureMode, RecoveryOptions, recover
from rvu_pipelines.recovery.signing_keys import trusted_fingerprint
from rvu_pipelines.recovery.state import RecoveryFiles, RecoveryPaths
from rvu_pipelines.scenarios.contract import Scenario

INCIDENT_FILE = "incident.jsonl"
CERTIFICATE_FILE = "certificate.json"
RECOVERY_FOLDER = "recovery"


@dataclass(frozen=True)
class EpisodeResult:
    """How one episode went; ``error`` is set (and the judgement fields are neutral) when it crashed."""

    scenario_id: str
    benchmark: str
    defense: str
    attack_succeeded: bool
    utility: float
    judge: str
    latency_s: float
    steps: int
    tool_calls: int
    blocked_calls: int
    flagged_outputs: int
    provenance_entries: int
    incident_path: str | None
    certificate_path: str | None
    certificate_verified: bool | None
    closure_mode: str | None
    closure_seeds: int | None
    closure_v1_size: int | None
    closure_v2_size: int | None
    recovery_s: float | None
    error: str | None = None
    aborted: str | None = None  # a defense stopped the episode before generation (hfer): its message

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


def _recover(incident: Path, defense: str, settings: DefenseSettings, workdir: Path) -> dict[str, Any]:
    """Recovery for rvu_v1 / rvu_v2 into a fresh per-episode store; the certificate is then verified
    against the pinned signing key."""
    folder = workdir / RECOVERY_FOLDER
    shutil.rmtree(folder, ignore_errors=True)  # a re-run starts from an empty store: same bytes out
    folder.mkdir(parents=True)
    key_dir = Path(settings.signing_key_dir) if settings.signing_key_dir else RecoveryPaths.default().keys
    mode: ClosureMode = "v1" if defense == "rvu_v1" else "v2"
    started = time.perf_counter()
    result = recover(
        incident,
        RecoveryFiles(folder / "provenance.duckdb", key_dir, workdir / CERTIFICATE_FILE),
        RecoveryOptions(detector=settings.detector, closure_mode=mode),
    )
    # pinned to the key this episode signed with; without it the certificate is not counted as verified
    # (an unpinned check proves integrity only: any key makes a self-consistent certificate)
    fingerprint = trusted_fingerprint(key_dir)
    pins = [fingerprint] if fingerprint is not None else []
    verified = bool(pins) and verify_certificate(result.certificate_path, trusted_fingerprints=pins)[0]
    return {
        "certificate_path": str(result.certificate_path),
        "certificate_verified": bool(verified),
        "closure_mode": mode,
        "closure_seeds": len(result.seeds),
        "closure_v1_size": len(result.closure_v1),
        "closure_v2_size": len(result.closure_v2),
        "recovery_s": round(time.perf_counter() - started, 4),
    }


def _closes_with(messages: list[Any], aborted: str | None) -> bool:
    if not aborted or not messages or messages[-1]["role"] != "assistant":
        return False
    content = messages[-1].get("content") or []
    return [block.get("content") for block in content] == [aborted]


def run_episode(
    scenario: Scenario, defense: str, llm: ChatModel, settings: DefenseSettings, workdir: Path
) -> EpisodeResult:
    """Build the defense's pipeline, run the scenario through it, write its provenance JSONL under
    ``workdir`` and, for rvu_v1 / rvu_v2, recover from it and write + verify the certificate."""
    workdir = Path(workdir)
    started = time.perf_counter()
    base: dict[str, Any] = {
        "scenario_id": scenario.scenario_id,
        "benchmark": scenario.benchmark,
        "defense": defense,
        "attack_succeeded": False,
        "utility": 0.0,
        "judge": "",
        "steps": 0,
        "tool_calls": 0,
        "blocked_calls": 0,
        "flagged_outputs": 0,
        "provenance_entries": 0,
        "incident_path": None,
        "certificate_path": None,
        "certificate_verified": None,
        "closure_mode": None,
        "closure_seeds": None,
        "closure_v1_size": None,
        "closure_v2_size": None,
        "recovery_s": None,
        "aborted": None,
    }
    try:
        pipeline = build_pipeline(defense, llm, scenario, settings)
        outcome = scenario.run(pipeline)
        messages = list(outcome.messages)
        abort = pipeline.trace.abort
        aborted = abort.reason if abort is not None else (outcome.details or {}).get("aborted")
        base.update(
            attack_succeeded=bool(outcome.attack_succeeded),
            utility=float(outcome.utility),
            judge=outcome.judge,
            # AgentDojo closes an aborted episode with the abort message as an assistant turn: not a step
            steps=sum(1 for m in messages if m["role"] == "assistant") - int(_closes_with(messages, aborted)),
            tool_calls=sum(1 for m in messages if m["role"] == "tool"),
            blocked_calls=len(pipeline.trace.blocked),
            aborted=aborted,
        )
        records = episode_records(
            scenario, defense, messages, detector=settings.detector, threshold=settings.threshold, trace=pipeline.trace
        )
        workdir.mkdir(parents=True, exist_ok=True)
        incident = write_incident(workdir / INCIDENT_FILE, records)
        base.update(
            flagged_outputs=contaminated_count(records), provenance_entries=len(records), incident_path=str(incident)
        )
        if defense in RECOVERING_DEFENSES:
            base.update(_recover(incident, defense, settings, workdir))
    except Exception as exc:  # one crashed scenario is one error row, never a lost cell
        return EpisodeResult(
            **base, latency_s=round(time.perf_counter() - started, 4), error=f"{type(exc).__name__}: {exc}"
        )
    return EpisodeResult(**base, latency_s=round(time.perf_counter() - started, 4))
