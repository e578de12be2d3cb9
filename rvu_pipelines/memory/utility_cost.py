"""The utility cost of the untrusted-channel rule on a real agent memory (seed 002 §9.5 in practice).

Every record a ReAct agent wrote after a web search is derived from untrusted input, so the monitor
rejects it until the USER endorses it, and reaching the shared memory is always a USER promotion.
``utility_cost`` replays one agent run's legitimate writes and counts those USER actions; the monitor
evaluation (``evaluation.py``) reports it next to the payload and benign-write counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rvu_pipelines.memory.audit import AuditLog
from rvu_pipelines.memory.model import Channel, Reason
from rvu_pipelines.memory.monitor import ReferenceMonitor
from rvu_pipelines.memory.store import InMemoryStore
from rvu_pipelines.memory.user_channel import UserChannel, UserChannelConfig

MEMORY_RECORD_PREFIX = "qa/"  # memory key of a record: qa/<qid>


@dataclass(frozen=True)
class UtilityResult:
    """The utility cost of the channel rule on one agent run's legitimate memory writes.

    One agent session, one episode per record (context reset between episodes): the user's question
    (USER), the agent's search result (WEB), the model's answer, then the agent writes the record in
    the user's turn. ``accepted_direct`` writes committed as the agent issued them; ``need_user``
    were rejected (Rule 4: derived from untrusted input) and committed only once the USER endorsed
    the content (observed on the USER channel and written again), ``endorsed`` of them. Reaching
    the shared memory is always a USER promotion (Rule 6): ``promotions_needed``, of which
    ``promotions_rate_limited`` hit the §9.5 limit with one episode every ``episode_seconds``.
    """

    workload: str
    writes: int
    accepted_direct: int
    need_user: int
    endorsed: int
    by_rule: dict[str, int]
    promotions_needed: int
    promotions_accepted: int
    promotions_rate_limited: int
    episode_seconds: float
    max_promotions_per_window: int | None
    promotion_window_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryRecord:
    """One record an agent wrote to its memory: the question, the search it ran, the answer."""

    qid: str
    question: str
    answer: str
    term: str | None = None
    description: str | None = None

    @property
    def searched(self) -> bool:
        return bool(self.term or self.description)

    def text(self) -> str:
        lines = [f"Question: {self.question}"]
        if self.searched:
            lines.append(f"Search[{self.term or ''}]: {self.description or ''}")
        lines.append(f"Answer: {self.answer}")
        return "\n".join(lines) + "\n"


def strategyqa_records(rows: Sequence[dict[str, Any]]) -> list[MemoryRecord]:
    """AgentPoison's ReAct-StrategyQA memory (the ``train`` split: what the agent stored after each
    episode) as records; rows are dicts with qid, question, answer, term, description."""
    return [
        MemoryRecord(
            str(r["qid"]),
            str(r["question"]),
            str(r["answer"]),
            None if r.get("term") is None else str(r["term"]),
            None if r.get("description") is None else str(r["description"]),
        )
        for r in rows
    ]


def utility_cost(
    records: Sequence[MemoryRecord],
    *,
    workload: str = "agent memory",
    episode_seconds: float = 60.0,
    config: UserChannelConfig | None = None,
    session: str = "agent",
    shared: str = "shared",
) -> UtilityResult:
    """Replay one agent run's legitimate memory writes through a monitor and count the USER actions.

    Per record (one episode, fresh context): the user's question arrives on USER; if the agent
    searched, the result arrives on WEB; the model derives the record from that context and the
    agent writes it in the user's turn. A rejected write is endorsed by the user (the record's text
    observed on USER and written again). Then the agent asks to promote the record to the shared
    memory (USER authoriser). The USER channel's clock advances ``episode_seconds`` per episode, so
    the promotion rate limit (``config``, §9.5 defaults: 10 per hour) is exercised at that pace.
    """
    now = [0.0]
    cfg = config or UserChannelConfig()
    uc = UserChannel(cfg, clock=lambda: now[0])
    monitor = ReferenceMonitor(InMemoryStore(), audit=AuditLog(), shared_namespace=shared, user_channel=uc)
    by_rule: Counter[str] = Counter()
    direct = need = endorsed = promoted = limited = 0
    for i, rec in enumerate(records):
        now[0] = i * episode_seconds
        key = MEMORY_RECORD_PREFIX + rec.qid
        text = rec.text()
        monitor.reset_context(session)
        monitor.observe(session, Channel.USER, rec.question)
        if rec.searched:
            monitor.observe(session, Channel.WEB, f"{rec.term or ''}: {rec.description or ''}")
        out = monitor.derive(session)
        d = monitor.write(session, key, text, channel=Channel.USER, deps=[out])
        by_rule[f"{'accepted' if d.accepted else 'rejected'}: Rule {int(d.rule)}"] += 1
        if d.accepted:
            direct += 1
        else:
            need += 1
            monitor.reset_context(session)
            confirmed = monitor.observe(session, Channel.USER, text)
            endorsed += monitor.write(session, key, text, channel=Channel.USER, deps=[confirmed]).accepted
        p = monitor.promote(session, key, authorizer=Channel.USER)
        promoted += p.accepted
        limited += p.reason is Reason.RATE_LIMITED
    monitor.close()
    return UtilityResult(
        workload,
        len(records),
        direct,
        need,
        endorsed,
        dict(sorted(by_rule.items())),
        len(records),
        promoted,
        limited,
        episode_seconds,
        cfg.max_promotions,
        cfg.promotion_window_s,
    )
