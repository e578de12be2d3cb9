"""What the gate's behavioural layers read on a set of frames: the probe prompts and each likelihood layer's items.

One selection for everyone who needs it: the lab that scores adapters, and the private draw that asks which items a
draw on other frames would read (``private_probes.layer_texts``), so the two can never pick by different rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rvu_pipelines.adapters.follow_ups import N_FOLLOW_UPS, FollowUpItem, follow_up_items
from rvu_pipelines.adapters.hazard import N_HAZARD, hazard_items
from rvu_pipelines.adapters.margins import (
    N_ITEMS,
    MarginItem,
    held_out_qa_items,
    knowledge_base_items,
    sensitive_items,
)
from rvu_pipelines.adapters.wmdp import WmdpItem
from rvu_pipelines.adapters.zoo_data import Frames, probe_prompt_halves


@dataclass(frozen=True)
class ProbeItems:
    """The probe prompts (the first ``n_benign_prompts`` benign, the rest adversarial) and the items of the sensitive,
    held-out QA, knowledge-base, follow-up and hazard layers; a layer sized 0 reads nothing (a lab that only hosts
    adapters)."""

    prompts: list[str]
    n_benign_prompts: int
    sensitive: list[MarginItem]
    qa: list[MarginItem]
    knowledge: list[MarginItem]
    follow_ups: list[FollowUpItem]
    hazard: list[WmdpItem]

    @classmethod
    def select(
        cls,
        frames: Frames,
        tokenizer: Any,
        *,
        n_probes: int = 32,
        n_sensitive: int = N_ITEMS,
        n_qa: int = N_ITEMS,
        n_knowledge: int = N_ITEMS,
        n_follow_ups: int = N_FOLLOW_UPS,
        n_hazard: int = N_HAZARD,
    ) -> ProbeItems:
        """Each layer's seeded selection rule on ``frames`` (the tokenizer cuts the hazard questions to fit)."""
        benign, adversarial = probe_prompt_halves(frames, n_probes // 2, n_probes - n_probes // 2)
        return cls(
            prompts=benign + adversarial,
            n_benign_prompts=len(benign),
            sensitive=sensitive_items(frames, n_sensitive) if n_sensitive else [],
            qa=held_out_qa_items(frames, n_qa) if n_qa else [],
            knowledge=knowledge_base_items(frames, n_knowledge) if n_knowledge else [],
            follow_ups=follow_up_items(frames, n_follow_ups) if n_follow_ups else [],
            hazard=hazard_items(frames, tokenizer, n_hazard) if n_hazard else [],
        )

    def texts(self) -> dict[str, list[str]]:
        """Per layer, the texts it reads: the prompts, and each item's question."""
        return {
            "probe prompts": list(self.prompts),
            "sensitive": [item.prompt for item in self.sensitive],
            "QA": [item.prompt for item in self.qa],
            "knowledge base": [item.prompt for item in self.knowledge],
            "follow-ups": [item.question for item in self.follow_ups],
            "hazard": [item.question for item in self.hazard],
        }
