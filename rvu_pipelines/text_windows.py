"""Overlapping windows over a token sequence, so a detector with a bounded input sees all of a long text.

An encoder reads at most its own window of tokens (256 for the sentence embedder, 512 for most
classifiers) and silently drops the rest; a detector that scores only what the encoder reads can be
walked past by putting the payload after a long enough benign prefix. Scoring every window of
``size`` tokens, ``stride`` apart, and taking the max closes that: each token is in some window, and
any run of at most ``size - stride + 1`` consecutive tokens lies whole inside one window (so a
stride of half the size keeps every run of half a window intact).

The helpers are plain index arithmetic over any sequence: token ids for a classifier that takes ids,
or the ``(start, end)`` character offsets a fast tokenizer reports, mapped back to substrings of the
original text for an encoder that takes strings (``char_spans``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def _check(size: int, stride: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"window size must be a positive int, got {size!r}")
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= size:
        raise ValueError(f"window stride must be an int in [1, size={size}] so no token is skipped, got {stride!r}")


def window_spans(n: int, size: int, stride: int) -> list[tuple[int, int]]:
    """``[start, end)`` spans of ``size`` items every ``stride``, the last one ending at ``n`` (the tail is
    always covered, even where ``n - size`` is not a multiple of ``stride``). A sequence no longer than one
    window is one span; an empty one has none."""
    _check(size, stride)
    if n < 0:
        raise ValueError(f"sequence length must be non-negative, got {n}")
    if n == 0:
        return []
    if n <= size:
        return [(0, n)]
    starts = list(range(0, n - size, stride))
    starts.append(n - size)
    return [(s, s + size) for s in starts]


def window_count(n: int, size: int, stride: int) -> int:
    """How many spans ``window_spans(n, size, stride)`` returns, without building them."""
    _check(size, stride)
    if n <= 0:
        return 0
    return 1 if n <= size else 1 + math.ceil((n - size) / stride)


def max_tokens(max_windows: int, size: int, stride: int) -> int:
    """The longest sequence that needs at most ``max_windows`` windows: the token budget of a window budget."""
    _check(size, stride)
    if max_windows < 1:
        raise ValueError(f"max_windows must be at least 1, got {max_windows}")
    return size + (max_windows - 1) * stride


def token_windows(tokens: Sequence[T], size: int, stride: int) -> list[Sequence[T]]:
    """The windows themselves (slices of ``tokens``), e.g. token ids to feed a classifier one window each."""
    return [tokens[start:end] for start, end in window_spans(len(tokens), size, stride)]


def char_spans(offsets: Sequence[tuple[int, int]], size: int, stride: int) -> list[tuple[int, int]]:
    """Character spans of the token windows, from per-token ``(start, end)`` offsets into the text: window
    ``[s, e)`` of tokens becomes ``text[offsets[s][0]:offsets[e - 1][1]]``, the original characters
    (casing, accents, spacing) an encoder that takes strings re-tokenizes to the same window."""
    return [(offsets[start][0], offsets[end - 1][1]) for start, end in window_spans(len(offsets), size, stride)]
