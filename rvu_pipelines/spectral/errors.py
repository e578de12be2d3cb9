"""The spectral kill switch's user-facing errors (all ``RvuError``s, so the CLI prints them without a traceback)."""

from __future__ import annotations

from rvu_pipelines.errors import RvuError


class SpectralError(RvuError):
    """Something the spectral kill switch was given or computed cannot be used."""


class SpectralInputError(SpectralError):
    """Bad input: empty text, a malformed attention matrix or signal, an invalid cut-off."""


class ContextLengthError(SpectralInputError):
    """The text has more tokens than the model's context window."""


class LayerIndexError(SpectralInputError):
    """A layer index outside the model's layers."""


class NoAttentionError(SpectralError):
    """The model returned no attention weights (a fused/SDPA kernel, or a model without attention outputs)."""


class CalibrationError(SpectralError):
    """The kill switch cannot be calibrated on the examples given (too few, one class only)."""
