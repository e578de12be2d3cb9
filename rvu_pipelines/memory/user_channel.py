"""§9.5 mitigations for the USER channel, the one trusted channel an adversary can reach by social
engineering: a diff view of every USER-authorised write, a rate limit on USER promotions (and,
optionally, writes), and a secondary content check that flags — never blocks — likely injections.

Attach a ``UserChannel`` to the monitor (``ReferenceMonitor(user_channel=...)``); every write or
promotion whose channel is USER then goes through it, whichever API the runtime calls, and the diff
and the content verdict land in that decision's audit record.
"""

from __future__ import annotations

import difflib
import math
import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from rvu_pipelines.hashing import sha256_bytes


@dataclass(frozen=True)
class UserChannelConfig:
    """Limits of the USER channel; ``None`` disables a limit. Windows are sliding, in seconds."""

    max_promotions: int | None = 10
    promotion_window_s: float = 3600.0
    max_writes: int | None = None
    write_window_s: float = 3600.0
    keep_diffs: int = 10_000


@dataclass(frozen=True)
class WriteDiff:
    """What a USER-authorised write would change: old vs new, shown before it commits."""

    session: str
    namespace: str
    key: str
    old: str | None
    new: str
    unified: str
    old_sha256: str | None
    new_sha256: str
    op: str = "WRITE"

    @property
    def created(self) -> bool:
        return self.old is None

    @property
    def changed(self) -> bool:
        return self.old != self.new

    def render(self) -> str:
        """Text for a terminal or UI: header, then the unified diff (or 'no change')."""
        head = f"{self.op} {self.namespace}/{self.key} (session {self.session})"
        if not self.changed:
            return f"{head}: no change"
        return f"{head}\n{self.unified}" if self.unified else head

    def audit_view(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "namespace": self.namespace,
            "key": self.key,
            "created": self.created,
            "old_sha256": self.old_sha256,
            "new_sha256": self.new_sha256,
            "unified": self.unified,
        }


def make_diff(session: str, namespace: str, key: str, old: str | None, new: str, op: str = "WRITE") -> WriteDiff:
    before = [] if old is None else old.splitlines(keepends=True)
    after = new.splitlines(keepends=True)
    unified = "".join(
        difflib.unified_diff(
            before, after, fromfile=f"a/{namespace}/{key}", tofile=f"b/{namespace}/{key}", lineterm="\n"
        )
    )
    return WriteDiff(
        session,
        namespace,
        key,
        old,
        new,
        unified,
        None if old is None else sha256_bytes(old.encode()),
        sha256_bytes(new.encode()),
        op,
    )


# ---------------------------------------------------------------- content checks


@dataclass(frozen=True)
class ContentVerdict:
    """A content check's opinion of one text; ``flagged`` is advisory (recorded, never enforced)."""

    check: str
    score: float
    flagged: bool
    matched: tuple[str, ...] = ()

    def audit_view(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "score": round(float(self.score), 6),
            "flagged": self.flagged,
            "matched": list(self.matched),
        }


@runtime_checkable
class ContentCheck(Protocol):
    """Secondary check on USER-channel content; the trained detectors plug in here."""

    name: str

    def check(self, text: str) -> ContentVerdict: ...


@runtime_checkable
class QueryAwareCheck(ContentCheck, Protocol):
    """A write check whose decision depends on the queries the agent has served (MEMSAD): the monitor hands it
    every USER-channel input it observes."""

    def observe_query(self, text: str) -> bool: ...


# A small default: phrases that recur in public injection corpora. The D1 heuristic (40+ patterns)
# and the trained detectors replace it through ``ScoreContentCheck``.
DEFAULT_PATTERNS: tuple[tuple[str, str], ...] = (
    (
        "ignore_instructions",
        r"\b(ignore|disregard|forget|skip)\b.{0,40}\b(previous|prior|above|earlier|all|any|your)\b.{0,30}"
        r"\b(instructions?|prompts?|rules?|directions?|context)\b",
    ),
    ("new_instructions", r"\b(new|updated|real|actual)\s+(instructions?|task|rules?|system prompt)\b"),
    ("override_identity", r"\b(you are now|from now on,? you|act as|pretend (to be|you are)|roleplay as)\b"),
    ("system_prompt", r"\b(system prompt|developer mode|jailbreak|do anything now|\bDAN\b)"),
    (
        "reveal_secrets",
        r"\b(reveal|print|show|output|leak|repeat)\b.{0,40}"
        r"\b(system prompt|password|secret|api key|credentials?|instructions)\b",
    ),
    ("exfiltrate", r"\b(send|post|upload|forward|email)\b.{0,60}(https?://|www\.|@[a-z0-9-]+\.[a-z]{2,})"),
    (
        "persist_memory",
        r"\b(remember|store|save|write)\b.{0,40}\b(memory|SOUL\.md|permanently|forever|every (time|session))\b",
    ),
    ("schedule", r"\b(cron|crontab|schedule[d]?|every \d+ (minutes?|hours?))\b"),
    ("markup_injection", r"(<\s*script|<!--|\[\[system\]\]|<\|im_start\|>|###\s*(system|instruction))"),
    ("german_ignore", r"\b(vergiss|ignoriere)\b.{0,40}\b(alles|anweisungen|vorherigen)\b"),
)


class RegexContentCheck:
    """Flags text matching any injection pattern; score = fraction of pattern groups matched (capped)."""

    def __init__(self, patterns: Sequence[tuple[str, str]] = DEFAULT_PATTERNS, name: str = "regex-default") -> None:
        self.name = name
        self._patterns = tuple((label, re.compile(rx, re.IGNORECASE | re.DOTALL)) for label, rx in patterns)

    def check(self, text: str) -> ContentVerdict:
        matched = tuple(label for label, rx in self._patterns if rx.search(text))
        score = min(1.0, len(matched) / 2.0)
        return ContentVerdict(self.name, score, bool(matched), matched)


class ScoreContentCheck:
    """Adapts any scorer (text -> probability of injection), e.g. a registered detector, to ContentCheck.

    A scorer that fails (raises, or returns NaN) never stops the monitor: the text is flagged
    with score 1.0 and ``matched=("detector_error",)``, so the failure shows in the audit record.
    """

    ERROR_MATCH = "detector_error"

    def __init__(self, name: str, score: Callable[[str], float], threshold: float = 0.5) -> None:
        self.name = name
        self._score = score
        self.threshold = threshold

    def check(self, text: str) -> ContentVerdict:
        try:
            value = float(self._score(text))
        except Exception:  # any scorer failure is a flag, never a crash of the write path
            value = math.nan
        if math.isnan(value):
            return ContentVerdict(self.name, 1.0, True, (self.ERROR_MATCH,))
        return ContentVerdict(self.name, value, value >= self.threshold)


# ---------------------------------------------------------------- rate limit


class SlidingWindowLimiter:
    """At most ``limit`` events per ``window_s`` seconds; events are counted when they commit."""

    def __init__(self, limit: int | None, window_s: float, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._events: deque[float] = deque()

    def allowed(self) -> bool:
        if self.limit is None:
            return True
        now = self._clock()
        events = self._events
        while events and now - events[0] >= self.window_s:
            events.popleft()
        return len(events) < self.limit

    def note(self) -> None:
        if self.limit is not None:
            self._events.append(self._clock())


# ---------------------------------------------------------------- the channel


Approver = Callable[[WriteDiff, "ContentVerdict | None"], bool]


@dataclass(frozen=True)
class UserReview:
    """The diff and content verdict for one USER-authorised write or promotion."""

    diff: WriteDiff
    verdict: ContentVerdict | None

    def audit_view(self) -> dict[str, Any]:
        return {
            "diff": self.diff.audit_view(),
            "content_check": None if self.verdict is None else self.verdict.audit_view(),
        }


@dataclass
class UserChannelStats:
    writes_reviewed: int = 0
    promotions_reviewed: int = 0
    flagged: int = 0
    rate_limited: int = 0
    declined: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


_DEFAULT_CHECK = object()


class UserChannel:
    """The §9.5 review every USER-channel write and promotion passes through inside the monitor.

    ``approver`` sees the diff (and the content verdict) before a write that the rules would accept
    commits; returning False declines it. Without one, writes are approved and the diffs are kept
    in ``diffs`` and the audit log for post-hoc review.
    """

    def __init__(
        self,
        config: UserChannelConfig | None = None,
        *,
        content_check: ContentCheck | None | object = _DEFAULT_CHECK,
        approver: Approver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or UserChannelConfig()
        self.content_check: ContentCheck | None = (
            RegexContentCheck() if content_check is _DEFAULT_CHECK else content_check  # type: ignore[assignment]
        )
        self.approver = approver
        self.promotions = SlidingWindowLimiter(self.config.max_promotions, self.config.promotion_window_s, clock)
        self.writes = SlidingWindowLimiter(self.config.max_writes, self.config.write_window_s, clock)
        self.diffs: deque[WriteDiff] = deque(maxlen=self.config.keep_diffs)
        self.flags: deque[tuple[WriteDiff, ContentVerdict]] = deque(maxlen=self.config.keep_diffs)
        self.stats = UserChannelStats()

    def review(
        self, session: str, namespace: str, key: str, old: str | None, new: str, op: str = "WRITE"
    ) -> UserReview:
        diff = make_diff(session, namespace, key, old, new, op)
        verdict = self.content_check.check(new) if self.content_check is not None else None
        self.diffs.append(diff)
        if op == "WRITE":
            self.stats.writes_reviewed += 1
        else:
            self.stats.promotions_reviewed += 1
        if verdict is not None and verdict.flagged:
            self.flags.append((diff, verdict))
            self.stats.flagged += 1
        return UserReview(diff, verdict)

    def approve(self, review: UserReview) -> bool:
        approved = True if self.approver is None else bool(self.approver(review.diff, review.verdict))
        if not approved:
            self.stats.declined += 1
        return approved

    def write_allowed(self) -> bool:
        ok = self.writes.allowed()
        if not ok:
            self.stats.rate_limited += 1
        return ok

    def promotion_allowed(self) -> bool:
        ok = self.promotions.allowed()
        if not ok:
            self.stats.rate_limited += 1
        return ok

    def note_write(self) -> None:
        self.writes.note()

    def note_promotion(self) -> None:
        self.promotions.note()
