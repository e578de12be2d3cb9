"""Agent memory behind a reference monitor (seed 002 §3-4, §9.5): provenance-based write integrity.

The runtime puts ``ReferenceMonitor`` on its memory path: labelled inputs become belief nodes
(``observe``/``derive``), and every READ/WRITE/PROMOTE is decided by Rules 1-9, committed only if
accepted, and recorded in a hash-chained ``AuditLog``. ``evaluate_monitor`` reproduces Tables 6-7.
"""

from pathlib import Path

from rvu_pipelines.memory.attacks import ATTACK_VECTORS, AttackOutcome, AttackSetting, AttackVector, run_attacks
from rvu_pipelines.memory.audit import AuditLog, AuditRecord, AuditVerification, DuckDBAuditSink, verify_chain
from rvu_pipelines.memory.evaluation import BenignResult, MonitorEvaluation, evaluate_monitor
from rvu_pipelines.memory.model import (
    Action,
    BatchActions,
    BatchDecisions,
    BeliefNode,
    Channel,
    Decision,
    Internal,
    MemoryItem,
    Op,
    Promote,
    Read,
    ReadResult,
    Reason,
    Rule,
    Trust,
    Write,
    trust_of,
)
from rvu_pipelines.memory.monitor import ReferenceMonitor
from rvu_pipelines.memory.store import DuckDBStore, InMemoryStore, MemoryStore, default_memory_db
from rvu_pipelines.memory.theorem import TheoremChecker, TheoremReport
from rvu_pipelines.memory.user_channel import (
    ContentCheck,
    ContentVerdict,
    RegexContentCheck,
    ScoreContentCheck,
    UserChannel,
    UserChannelConfig,
    WriteDiff,
)
from rvu_pipelines.memory.utility_cost import MemoryRecord, UtilityResult, strategyqa_records, utility_cost


def open_memory(
    path: Path | str | None = None,
    *,
    user_channel: UserChannel | None = None,
    shared_namespace: str = "shared",
    write_check: ContentCheck | None = None,
) -> ReferenceMonitor:
    """A monitor over one DuckDB file holding the items and the audit log (default: the state dir).

    M_0 is loaded from the file and the audit chain continues where it ended; ``close()`` (or a
    ``with`` block) flushes both and closes the file. ``write_check`` is an enforced content check on
    every write the rules accept (e.g. ``memory_poisoning.monitor_check.DetectorWriteCheck``).
    """
    store = DuckDBStore(path if path is not None else default_memory_db())
    return ReferenceMonitor(
        store,
        audit=AuditLog(DuckDBAuditSink(connection=store.connection)),
        shared_namespace=shared_namespace,
        user_channel=user_channel,
        write_check=write_check,
    )


__all__ = [
    "ATTACK_VECTORS",
    "Action",
    "AttackOutcome",
    "AttackSetting",
    "AttackVector",
    "AuditLog",
    "AuditRecord",
    "AuditVerification",
    "BatchActions",
    "BenignResult",
    "BatchDecisions",
    "BeliefNode",
    "Channel",
    "ContentCheck",
    "ContentVerdict",
    "Decision",
    "DuckDBAuditSink",
    "DuckDBStore",
    "InMemoryStore",
    "Internal",
    "MemoryItem",
    "MemoryRecord",
    "MemoryStore",
    "MonitorEvaluation",
    "Op",
    "Promote",
    "Read",
    "ReadResult",
    "Reason",
    "ReferenceMonitor",
    "RegexContentCheck",
    "Rule",
    "ScoreContentCheck",
    "TheoremChecker",
    "TheoremReport",
    "Trust",
    "UserChannel",
    "UserChannelConfig",
    "UtilityResult",
    "Write",
    "WriteDiff",
    "default_memory_db",
    "evaluate_monitor",
    "open_memory",
    "run_attacks",
    "strategyqa_records",
    "trust_of",
    "utility_cost",
    "verify_chain",
]
