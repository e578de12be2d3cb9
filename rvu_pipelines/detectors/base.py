"""The one plug-in interface every injection detector implements, and adapters for its consumers.

The recovery pipeline (``RecoveryOptions(detector=...)``: it scores the content of each action record and
records the detector's ``name`` and, if set, ``version`` in the certificate), the attack harness and,
through :func:`as_text_scorer`, the memory monitor's USER-channel content check all take an
:class:`InjectionDetector`; whether it is a regex list, a registered MLflow model or a fine-tuned
transformer is invisible to them. Scores are probabilities of "injection" in [0, 1].

A detector whose model reads a bounded input (a transformer's token window, a bag of n-grams that a long
benign text dilutes) declares its windows (``DetectorBase._window_spans``); :meth:`DetectorBase.score`
scores every window and aggregates, so no caller sees a silently truncated text.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, Self, runtime_checkable

import numpy as np

from rvu_pipelines.errors import DetectorError
from rvu_pipelines.text_rules import escape_lone_surrogates, lone_surrogate_at
from rvu_pipelines.text_windows import window_spans

DEFAULT_THRESHOLD = 0.5
DEFAULT_MAX_CHARS = 1_000_000
Aggregate = Literal["max", "mean"]
AGGREGATES: tuple[Aggregate, ...] = ("max", "mean")
Span = tuple[int, int]


@runtime_checkable
class InjectionDetector(Protocol):
    """P(injection | text) for a batch of texts, deterministically; ``predict`` thresholds it."""

    name: str

    def score(self, texts: Sequence[str]) -> np.ndarray: ...

    def predict(self, texts: Sequence[str], threshold: float = DEFAULT_THRESHOLD) -> np.ndarray: ...


class DetectorBase:
    """Shared ``score`` / ``predict``: input checks, windows and their aggregation, so each detector writes
    ``_score`` (the model on a batch of windows) and, if its input is bounded, ``_window_spans``.

    ``score(texts)`` decides each text in this order:

    - ``texts`` must be a list of ``str``: a bare string, or an item that is not a ``str`` (bytes, None, ...),
      is a :class:`DetectorError` naming the detector, the item's index and the fix;
    - a text longer than ``max_chars`` characters (1,000,000 by default) scores **1.0** without being
      tokenized: too long to screen, so it fails closed (a 10 MB text is refused in milliseconds);
    - an empty or whitespace-only text scores **0.0** without calling the model (nothing to inject);
    - a lone UTF-16 surrogate (a ``str`` that no UTF-8 encoder accepts, e.g. ``"\\udc80"``) is written as its
      ``\\uXXXX`` escape (:func:`~rvu_pipelines.text_rules.escape_lone_surrogates`) and the text scored as
      usual, so a tokenizer never sees it; NUL and other control or binary-looking characters are scored
      like any other text;
    - the text is cut into the windows ``_window_spans`` returns (the whole text unless the detector
      overrides it), the windows of all texts are scored in one ``_score`` call (batching is the
      detector's), and the text's score is ``aggregate`` over its windows: ``"max"`` (default: an injection
      in any window flags the text) or ``"mean"``. A text of one window scores exactly what ``_score``
      gives it.
    """

    name: str = "detector"
    max_chars: int = DEFAULT_MAX_CHARS
    aggregate: Aggregate = "max"

    def score(self, texts: Sequence[str]) -> np.ndarray:
        checked = check_texts(texts, self.name)
        mode = check_aggregate(self.aggregate, self.name)
        out = np.zeros(len(checked), dtype=np.float64)
        windows: list[str] = []
        owners: list[int] = []
        for index, text in enumerate(checked):
            planned = self._plan(text)
            if isinstance(planned, float):
                out[index] = planned
                continue
            screened, spans = planned
            windows.extend(screened[start:end] for start, end in spans)
            owners.extend([index] * len(spans))
        if windows:
            scores = check_scores(self._score(windows), len(windows), self.name)
            owner = np.asarray(owners, dtype=np.intp)
            if mode == "max":
                np.maximum.at(out, owner, scores)  # out starts at 0 and scores are >= 0
            else:
                counts = np.bincount(owner, minlength=len(checked))
                sums = np.bincount(owner, weights=scores, minlength=len(checked))
                scored = counts > 0
                out[scored] = sums[scored] / counts[scored]
        return out

    def predict(self, texts: Sequence[str], threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
        return self.score(texts) >= check_threshold(threshold)

    def window_scores(self, text: str) -> list[tuple[Span, float]]:
        """``((start, end), score)`` of each window of ``text``, for explanations: ``score([text])`` is their
        aggregate. Spans index the screened text (``text`` itself unless it holds lone surrogates, which
        are escaped first); a blank text has no windows, a text over ``max_chars`` one of score 1.0."""
        (checked,) = check_texts([text], self.name)
        planned = self._plan(checked)
        if isinstance(planned, float):
            return [((0, len(checked)), planned)] if planned else []
        screened, spans = planned
        scores = check_scores(self._score([screened[s:e] for s, e in spans]), len(spans), self.name)
        return [(span, float(value)) for span, value in zip(spans, scores, strict=True)]

    def with_aggregate(self, aggregate: Aggregate) -> Self:
        """A shallow copy (same model) that aggregates its windows' scores with ``aggregate``."""
        clone = copy.copy(self)
        clone.aggregate = check_aggregate(aggregate, self.name)
        return clone

    def _plan(self, text: str) -> float | tuple[str, list[Span]]:
        """The text's score when it is decided without the model, else the screened text and its windows."""
        if len(text) > self.max_chars:
            return 1.0
        if not text or text.isspace():
            return 0.0
        screened = text if lone_surrogate_at(text) is None else escape_lone_surrogates(text)
        return screened, self._window_spans(screened) or [(0, len(screened))]

    def _window_spans(self, text: str) -> list[Span]:
        """``[start, end)`` character spans of the windows ``_score`` reads whole; the default is one window."""
        return [(0, len(text))]

    def _score(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError


class MemoizedDetector:
    """A deterministic detector that scores each distinct text once.

    In an attack cell the same tool output is scored by the classifier defense, by the provenance
    flags and by recovery's contamination signal, and recurs across defenses; a transformer detector
    (NanoGuard: a full forward pass per text) need not see it again. Other attributes (``name``,
    ``registered``) are the wrapped detector's.
    """

    # Declared for type checkers only (no class attribute is created): at run time both come from the
    # wrapped detector through ``__getattr__``, and ``version`` stays absent where the wrapped one has none.
    name: str
    version: str

    def __init__(self, detector: InjectionDetector) -> None:
        self.detector = detector
        self._scores: dict[str, float] = {}

    def __getattr__(self, item: str) -> object:
        if item == "detector":  # not yet set (copy/unpickle): do not recurse
            raise AttributeError(item)
        return getattr(self.detector, item)

    def score(self, texts: Sequence[str]) -> np.ndarray:
        checked = check_texts(texts, getattr(self.detector, "name", "detector"))
        missing = [text for text in dict.fromkeys(checked) if text not in self._scores]
        if missing:
            self._scores.update(zip(missing, (float(s) for s in self.detector.score(missing)), strict=True))
        return np.array([self._scores[text] for text in checked], dtype=np.float64)

    def predict(self, texts: Sequence[str], threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
        return self.score(texts) >= check_threshold(threshold)


def check_texts(texts: Sequence[str], who: str = "detector") -> list[str]:
    """A list of strings; a bare string is refused (it would be scored character by character), and so is
    an item that is not a ``str``, by index."""
    if isinstance(texts, (str, bytes)):
        raise DetectorError(
            f"{who}.score expects a list of texts, got a single {type(texts).__name__}; wrap it: score([text])."
        )
    checked = list(texts)
    bad = [i for i, text in enumerate(checked) if not isinstance(text, str)]
    if bad:
        others = f" ({len(bad)} items are not str: {bad[:5]})" if len(bad) > 1 else ""
        raise DetectorError(
            f"{who}.score expects strings; item {bad[0]} is {type(checked[bad[0]]).__name__}{others}. "
            "Pass each text as str: decode bytes first, e.g. data.decode('utf-8', errors='replace')."
        )
    return checked


def check_aggregate(aggregate: str, who: str = "detector") -> Aggregate:
    if aggregate not in AGGREGATES:
        raise DetectorError(f"{who}: invalid window aggregate {aggregate!r}; allowed values are max, mean.")
    return aggregate  # type: ignore[return-value]  # one of AGGREGATES


def check_scores(scores: object, n: int, who: str) -> np.ndarray:
    """Float64 probabilities of shape (n,), or a DetectorError naming the detector that broke them."""
    array = np.asarray(scores, dtype=np.float64).reshape(-1)
    if array.shape != (n,):
        raise DetectorError(f"{who} returned {array.shape[0]} scores for {n} texts.")
    if not np.all(np.isfinite(array)) or array.min(initial=0.0) < 0.0 or array.max(initial=0.0) > 1.0:
        raise DetectorError(f"{who} returned scores outside [0, 1] (or NaN); a detector must return probabilities.")
    return array


def check_threshold(threshold: float) -> float:
    if not 0.0 <= float(threshold) <= 1.0:
        raise DetectorError(f"Invalid threshold {threshold}: allowed values are 0.0 to 1.0.")
    return float(threshold)


def as_contamination_detector(
    detector: InjectionDetector, threshold: float = DEFAULT_THRESHOLD
) -> Callable[[str], bool]:
    """``text -> is it an injection?`` at ``threshold``, from any detector (registered or not), for a
    caller that needs a yes/no filter; recovery and the attack harness take the detector itself."""
    limit = check_threshold(threshold)

    def is_contaminated(text: str) -> bool:
        return bool(detector.score([text])[0] >= limit)

    is_contaminated.__name__ = f"contaminated_by_{detector.name}"
    return is_contaminated


def as_text_scorer(detector: InjectionDetector) -> Callable[[str], float]:
    """``text -> P(injection)``: fits the memory monitor's ``ScoreContentCheck(name, score)``."""

    def score_one(text: str) -> float:
        return float(detector.score([text])[0])

    return score_one


def fitted_spans(
    text: str,
    offsets: Sequence[tuple[int, int]],
    size: int,
    stride: int,
    count: Callable[[list[str]], list[int]],
    starts_word: Sequence[bool] | None = None,
) -> list[Span]:
    """Character spans of the token windows ``window_spans(len(offsets), size, stride)``, each of which
    re-tokenizes to at most ``size`` tokens.

    ``offsets`` are each token's ``(start, end)`` in ``text``; ``count`` gives the token count of each of a
    list of substrings. With ``starts_word`` (per token: does a word start here), a window's ends move to
    word boundaries, by at most a quarter of the stride (so consecutive windows still overlap), and a
    window of whole words re-tokenizes to exactly its tokens. A substring cut inside a word may take a few
    more tokens than its span: such a window's start moves forward by the excess (the previous window
    holds what it drops) until it fits, so the model never truncates the window's end.
    """
    n = len(offsets)
    slack = stride // 4
    spans = []
    for start, end in window_spans(n, size, stride):
        if starts_word is not None:
            start = next((t for t in range(start, min(start + slack, end - 1) + 1) if starts_word[t]), start)
            end = next((t for t in range(end, max(end - slack, start + 1) - 1, -1) if t == n or starts_word[t]), end)
        spans.append((start, end))
    pending = list(range(len(spans)))
    while pending:
        chars = [(offsets[spans[i][0]][0], offsets[spans[i][1] - 1][1]) for i in pending]
        lengths = count([text[a:b] for a, b in chars])
        again = []
        for i, length in zip(pending, lengths, strict=True):
            start, end = spans[i]
            if length > size and end - start > 1:
                spans[i] = (min(start + length - size, end - 1), end)
                again.append(i)
        pending = again
    return [(offsets[start][0], offsets[end - 1][1]) for start, end in spans]


def tokenizer_window_spans(tokenizer: Any, text: str, max_length: int) -> list[Span]:
    """Windows of ``text`` for a model that reads at most ``max_length`` tokens of a Hugging Face fast
    tokenizer, its special tokens ([CLS]/[SEP], ...) included: ``max_length`` minus those tokens per window,
    half a window apart, at word boundaries (the offsets and word ids the tokenizer reports); a text that
    fits is one window, the whole text."""
    size = max_length - int(tokenizer.num_special_tokens_to_add(pair=False))
    if size < 2:
        raise DetectorError(f"max_length={max_length} leaves {size} tokens a window after the special tokens.")
    plain = {"add_special_tokens": False, "return_attention_mask": False, "return_token_type_ids": False}
    encoding = tokenizer(text, return_offsets_mapping=True, verbose=False, **plain)
    offsets = encoding["offset_mapping"]
    if len(offsets) <= size:
        return [(0, len(text))]
    words = encoding.word_ids()
    starts_word = [i == 0 or words[i] != words[i - 1] for i in range(len(words))]

    def count(windows: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(windows, verbose=False, **plain)["input_ids"]]

    return fitted_spans(text, offsets, size, size // 2, count, starts_word)
