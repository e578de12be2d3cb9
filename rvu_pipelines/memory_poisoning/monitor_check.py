"""A write-time memory-poisoning detector as the reference monitor's enforced content check.

``ReferenceMonitor(write_check=DetectorWriteCheck(detector, embedder))`` scores every value a write
would commit with the fitted detector (MEMSAD, the hybrid, a composite) and rejects it under
Rule.WRITE_CHECK when the detector flags it; the verdict lands in the audit record.

The check is a security control, so it fails closed: a value it cannot score is refused with a reason,
never passed and never turned into an exception out of the monitor:

* ``invalid_text``: not a str, or text no store can hold (``rvu_pipelines.text_rules``);
* ``empty``: nothing the encoder reads (blank, or only characters the tokenizer drops);
* ``too_long``: more than ``max_windows`` windows of text; decided from the character count first, so a
  huge value is refused before it is tokenized or embedded;
* ``check_error``: the embedder or detector failed on this value.

A refused-unscored verdict carries the detector's threshold as its score (a finite number the audit
JSON can hold, and the boundary the value was treated as reaching); ``matched`` says why.

Windowed scoring. The encoder reads a bounded prefix, and a detector calibrated on short memory entries
compares one embedding of the whole value with the queries, so benign text around a poison pulls its
embedding away from them: a poison refused alone passes behind enough benign text, long before the
encoder's own window is full. The value is therefore cut into overlapping token windows (the embedder's
own tokenizer, ``rvu_pipelines.text_windows``) about the length of the entries the detector was
calibrated on; each window is scored, the verdict's score is the max and it is flagged if any window is.
A value no longer than one window is one window: scored whole, exactly as the calibration entries were.

The served-query history. A detector that scores against the queries the agent has served (MEMSAD) must
see them as they are served: the monitor hands every USER-channel input it observes to ``observe_query``,
which embeds it and appends it to the detector's rolling history, so each write is decided against the
history the defender has at that moment, never one assembled afterwards.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rvu_pipelines.memory.user_channel import ContentVerdict
from rvu_pipelines.memory_poisoning.defenses.base import WriteDetector
from rvu_pipelines.memory_poisoning.retrieval import embed_texts
from rvu_pipelines.models.embedding import Embedder
from rvu_pipelines.text_rules import text_problem
from rvu_pipelines.text_windows import char_spans, max_tokens, window_count

# The window when neither a size nor the calibration texts are given: what ``calibration_window`` derives
# from the StrategyQA benign memory entries (question, search step, answer) MEMSAD is calibrated on. A
# window much longer than the calibration entries lets the benign text beside a poison dilute it again.
DEFAULT_WINDOW_TOKENS = 48
MIN_WINDOW_TOKENS = 16
WINDOW_QUANTILE = 0.99  # share of calibration entries that fit in one window when the size is derived
DEFAULT_MAX_WINDOWS = 128
# The character cap is the token budget times this, checked before tokenizing: natural text has far fewer
# characters per word piece, so it meets the token budget first; only padding (runs of blanks) meets the cap.
CHARS_PER_TOKEN_CEILING = 8
DEFAULT_ENCODER_TOKENS = 256  # an embedder that does not say how many tokens it reads

INVALID_TEXT, EMPTY, TOO_LONG, CHECK_ERROR, ABOVE_THRESHOLD = (
    "invalid_text",
    "empty",
    "too_long",
    "check_error",
    "above_threshold",
)

# text -> the (start, end) character offsets of its tokens, in order
TokenOffsets = Callable[[str], Sequence[tuple[int, int]]]
_WORD = re.compile(r"\S+")


def word_offsets(text: str) -> list[tuple[int, int]]:
    """Whitespace-separated words as tokens: the fallback for an embedder that exposes no tokenizer."""
    return [m.span() for m in _WORD.finditer(text)]


def tokenizer_offsets(tokenizer: Any) -> TokenOffsets:
    """Offsets from a Hugging Face fast tokenizer (``return_offsets_mapping``), special tokens left out."""

    def offsets(text: str) -> list[tuple[int, int]]:
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        return [(int(a), int(b)) for a, b in encoding["offset_mapping"] if b > a]

    return offsets


def embedder_offsets(embedder: Embedder) -> TokenOffsets:
    """The embedder's own tokenizer when it exposes a fast one (``SentenceEmbedder.tokenizer``), else words."""
    tokenizer = getattr(embedder, "tokenizer", None)
    if tokenizer is not None and getattr(tokenizer, "is_fast", False):
        return tokenizer_offsets(tokenizer)
    return word_offsets


def calibration_window(
    texts: Sequence[str], offsets: TokenOffsets, *, quantile: float = WINDOW_QUANTILE, limit: int
) -> int:
    """Window size matched to the calibration entries: the ``quantile`` of their token lengths, so that
    share of them is one window (scored as calibrated), clipped to ``[MIN_WINDOW_TOKENS, limit]``."""
    lengths = [len(offsets(t)) for t in texts if text_problem(t) is None and t.strip()]
    if not lengths:
        return min(DEFAULT_WINDOW_TOKENS, limit)
    size = math.ceil(float(np.quantile(np.asarray(lengths, dtype=np.float64), quantile)))
    return max(MIN_WINDOW_TOKENS, min(size, limit))


class DetectorWriteCheck:
    """Adapts a fitted ``WriteDetector`` + its embedder to the monitor's ``ContentCheck`` protocol.

    ``window_tokens`` sets the window; without it the window is derived from ``reference_texts`` (the
    detector's calibration entries) by ``calibration_window``, else ``DEFAULT_WINDOW_TOKENS``; it never
    exceeds what the encoder reads. ``stride_tokens`` defaults to half a window, so every run of half a
    window lies whole inside one window. A value needing more than ``max_windows`` windows (``max_tokens``
    tokens), or longer than ``max_chars`` characters (refused before tokenizing), is refused as too long.
    """

    def __init__(
        self,
        detector: WriteDetector,
        embedder: Embedder,
        name: str | None = None,
        *,
        window_tokens: int | None = None,
        stride_tokens: int | None = None,
        reference_texts: Sequence[str] = (),
        max_windows: int = DEFAULT_MAX_WINDOWS,
        offsets: TokenOffsets | None = None,
    ) -> None:
        self.detector = detector
        self.embedder = embedder
        self.name = name or f"write-check:{detector.name}"
        self.offsets: TokenOffsets = offsets or embedder_offsets(embedder)
        encoder_tokens = int(getattr(embedder, "max_tokens", DEFAULT_ENCODER_TOKENS))
        limit = max(1, encoder_tokens - 2)  # [CLS] and [SEP] take two of the encoder's positions
        if window_tokens is None:
            window_tokens = (
                calibration_window(reference_texts, self.offsets, limit=limit)
                if reference_texts
                else min(DEFAULT_WINDOW_TOKENS, limit)
            )
        if not 1 <= window_tokens <= limit:
            raise ValueError(f"window_tokens must be in [1, {limit}] (what the encoder reads), got {window_tokens}")
        self.window_tokens = int(window_tokens)
        self.stride_tokens = int(stride_tokens if stride_tokens is not None else max(1, window_tokens // 2))
        self.max_windows = int(max_windows)
        self.max_tokens = max_tokens(self.max_windows, self.window_tokens, self.stride_tokens)
        self.max_chars = self.max_tokens * CHARS_PER_TOKEN_CEILING
        self.queries_observed = self.history_errors = 0
        self._unscored()  # an unfitted detector is a configuration error: say so now, not at every write

    def _unscored(self) -> float:
        """The score of a value refused without scoring: the detector's threshold, finite for the audit."""
        value = float(self.detector.threshold)
        return value if math.isfinite(value) else 0.0

    def _refuse(self, reason: str, *detail: str) -> ContentVerdict:
        try:
            score = self._unscored()
        except Exception:  # noqa: BLE001 - the verdict must still be returned
            score = 0.0
        return ContentVerdict(self.name, score, True, (reason, *detail))

    def windows(self, text: str) -> list[str]:
        """The substrings of ``text`` that are scored: one per token window; a text that fits one is itself."""
        return self._windows(text, self.offsets(text))

    def _windows(self, text: str, offsets: Sequence[tuple[int, int]]) -> list[str]:
        if len(offsets) <= self.window_tokens:
            return [text]
        return [text[start:end] for start, end in char_spans(offsets, self.window_tokens, self.stride_tokens)]

    def observe_query(self, text: str) -> bool:
        """A query the agent served joins the detector's history (MEMSAD's rolling calibration, ``observe``), so
        the check decides against what the defender has served up to now. False when the detector keeps no
        history or the text cannot be embedded (counted in ``history_errors``; the history is then one short)."""
        observe = getattr(self.detector, "observe", None)
        if observe is None or text_problem(text) is not None or not text.strip():
            return False
        try:
            observe(embed_texts(self.embedder, [text], "served query"))
        except Exception:  # noqa: BLE001 - serving a query must not fail because its history update did
            self.history_errors += 1
            return False
        self.queries_observed += 1
        return True

    def check(self, text: str) -> ContentVerdict:
        """The verdict on one value; never raises: what cannot be scored is a flagged verdict naming why."""
        if text_problem(text) is not None:
            return self._refuse(INVALID_TEXT)
        if len(text) > self.max_chars:
            return self._refuse(TOO_LONG)
        if not text.strip():
            return self._refuse(EMPTY)
        try:
            offsets = self.offsets(text)
            if not offsets:
                return self._refuse(EMPTY)
            if window_count(len(offsets), self.window_tokens, self.stride_tokens) > self.max_windows:
                return self._refuse(TOO_LONG)
            windows = self._windows(text, offsets)
            vectors = embed_texts(self.embedder, windows, "memory write")
            scores = np.asarray(self.detector.score(vectors, windows), dtype=np.float64).reshape(-1)
            flags = np.asarray(self.detector.flags(vectors, windows), dtype=bool).reshape(-1)
            if scores.size != len(windows) or flags.size != len(windows) or not np.isfinite(scores).all():
                return self._refuse(CHECK_ERROR, "bad_scores")
        except Exception as exc:  # noqa: BLE001 - fail closed: an unscorable value is refused, not let through
            return self._refuse(CHECK_ERROR, type(exc).__name__)
        worst = int(np.argmax(scores))
        flagged = bool(flags.any())
        return ContentVerdict(self.name, float(scores[worst]), flagged, (ABOVE_THRESHOLD,) if flagged else ())
