"""Why an adapter was not loaded: one exception with a machine-readable reason and a sentence for people."""

from __future__ import annotations

from typing import Literal

RefusalReason = Literal[
    "no_manifest",
    "bad_manifest",
    "not_safetensors",
    "pickle_file",
    "corrupted",
    "sha256_mismatch",
    "other_base_model",
    "unknown_target_module",
    "shape_mismatch",
    "non_finite",
    "unsafe_scaling",
    "unsafe_delta",
    "symlink",
    "blocklisted",
    "not_allowlisted",
    "gate_projection",
    "gate_ood",
    "gate_behaviour",
    "gate_sensitive",
    "gate_qa_drop",
    "gate_follow_up",
    "gate_kb_drop",
    "gate_hazard",
    "not_screened",
    "not_admitted",
]


class AdapterRefused(ValueError):
    """An adapter that must not be loaded; ``reason`` is stable for code and logs, the message explains."""

    def __init__(self, reason: RefusalReason, message: str) -> None:
        super().__init__(message)
        self.reason: RefusalReason = reason
