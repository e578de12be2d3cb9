"""D1: the rule-based baseline of seed 002 §5.2 (regexes in five weighted groups, no training).

Score = the largest weight among the groups with a matching pattern (0 when nothing matches), so the
detector says how bad the worst sign is, not how many signs there are. Patterns were written from
the public descriptions of each attack class (OWASP LLM01, the paper's taxonomy), never fitted to a
test split; German variants are included because deepset's corpus is bilingual.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rvu_pipelines.detectors.base import DetectorBase
from rvu_pipelines.detectors.catalog import detector_plugin

_PREV = r"(?:previous|prior|above|earlier|preceding|foregoing|original|initial|old|all|any|your|the)"
_INSTR = r"(?:instructions?|prompts?|rules?|directions?|directives?|guidelines?|commands?|context|orders?|tasks?)"


@dataclass(frozen=True)
class PatternGroup:
    name: str
    weight: float
    patterns: tuple[tuple[str, str], ...]  # (label, regex)


GROUPS: tuple[PatternGroup, ...] = (
    PatternGroup(
        "instruction_override",
        0.9,
        (
            (
                "ignore_previous",
                rf"\b(?:ignore|disregard|forget|skip|drop|abandon)\b.{{0,40}}\b{_PREV}\b.{{0,30}}\b{_INSTR}\b",
            ),
            ("ignore_everything", r"\b(?:ignore|forget|disregard)\s+(?:everything|all of (?:that|this|the above))\b"),
            ("override_instructions", rf"\b(?:override|overwrite|bypass|circumvent|replace)\b.{{0,30}}\b{_INSTR}\b"),
            (
                "new_instructions",
                r"\b(?:new|updated|real|actual|true|revised|following)\s+(?:instructions?|tasks?|rules?|system prompt|orders?)\s*(?::|are|is)",
            ),
            ("instead_do", r"\binstead\s*,?\s+(?:you (?:will|must|should)|do|say|write|print|output|tell)\b"),
            ("stop_now", r"\b(?:stop|halt)\b.{0,20}\b(?:now|immediately|what you are doing)\b.{0,40}\b(?:and|then)\b"),
            (
                "do_not_follow",
                rf"\b(?:do not|don't|never)\s+(?:follow|obey|listen to|comply with)\b.{{0,30}}\b{_INSTR}\b",
            ),
            (
                "priority_claim",
                r"\b(?:highest|top|maximum|absolute)\s+priority\b|\bthis (?:instruction|message) (?:overrides|supersedes)\b",
            ),
            ("end_of_prompt", r"(?:\bend of (?:the )?(?:prompt|instructions|context|system message)\b|-{3,}\s*end\b)"),
            (
                "now_you_must",
                r"\bnow\s+(?:you\s+)?(?:must|have to|will|should)\s+(?:only\s+)?(?:say|write|answer|reply|respond|output|print)\b",
            ),
            (
                "de_forget",
                r"\b(?:vergiss|vergessen sie|ignoriere|ignorieren sie|missachte)\b.{0,40}\b(?:alles|alle|vorherigen|bisherigen|obigen|anweisungen|aufgaben|befehle)\b",
            ),
            ("de_new_task", r"\b(?:neue|nun folgende|jetzt folgende)\s+(?:aufgabe|anweisung|anweisungen|befehle)\b"),
            ("de_now_must", r"\b(?:jetzt|nun)\s+(?:musst|sollst|wirst)\s+du\b"),
        ),
    ),
    PatternGroup(
        "role_hijack",
        0.8,
        (
            ("you_are_now", r"\byou are (?:now|no longer|from now on)\b"),
            ("from_now_on", r"\bfrom now on\b.{0,40}\b(?:you|act|respond|answer|behave)\b"),
            ("pretend", r"\b(?:pretend|imagine|suppose)\s+(?:to be|you are|that you are|you're)\b"),
            (
                "act_as_unrestricted",
                r"\bact as\b.{0,60}\b(?:unrestricted|unfiltered|uncensored|without (?:any )?(?:restrictions|limits|filters|rules))\b",
            ),
            # the persona acronyms only in capitals ("aim", "dan" are ordinary words)
            (
                "dan",
                r"(?-i:\b(?:DAN|STAN|DUDE|AIM)\b)|\b(?:do anything now|developer mode|jailbreak(?:ed)? mode|god mode)\b",
            ),
            (
                "no_restrictions",
                r"\b(?:no|without|free (?:of|from))\s+(?:any\s+)?(?:restrictions|limitations|filters|censorship|content polic(?:y|ies)|ethical guidelines|moral(?:s|ity)?)\b",
            ),
            ("break_character", r"\b(?:stay in character|never break character|break character)\b"),
            (
                "two_responses",
                r"\b(?:two|2|dual) (?:different |separate )?(?:responses|answers|paragraphs)\b.{0,80}\b(?:normal|classic|jailbr|unfiltered|developer)",
            ),
            (
                "ignore_policy",
                r"\b(?:ignore|bypass|disable|violate)\b.{0,30}\b(?:openai|content|safety|usage)\s+polic(?:y|ies)\b",
            ),
            ("system_role_tag", r"(?:^|\s)(?:system|assistant)\s*:\s*(?:you are|ignore|new)\b"),
            ("de_you_are_now", r"\b(?:du bist (?:jetzt|nun|ab sofort)|stell dir vor,? du bist|tu so,? als)\b"),
        ),
    ),
    PatternGroup(
        "exfiltration",
        0.85,
        (
            (
                "reveal_prompt",
                r"\b(?:reveal|show|print|output|repeat|display|tell me|give me|leak|disclose|spell out)\b.{0,40}\b(?:system prompt|initial prompt|hidden prompt|your (?:instructions|prompt|rules)|pre-?prompt)\b",
            ),
            ("what_is_your_prompt", r"\bwhat (?:is|are|were) your (?:system )?(?:prompt|instructions|rules)\b"),
            (
                "secrets",
                r"\b(?:reveal|send|share|print|leak|expose|give me)\b.{0,40}\b(?:password|passwords|secret|api[ _-]?keys?|credentials?|tokens?|private keys?)\b",
            ),
            ("send_to_url", r"\b(?:send|post|upload|forward|transmit|exfiltrate)\b.{0,60}(?:https?://|www\.)"),
            ("send_to_email", r"\b(?:send|forward|email|mail)\b.{0,60}\b[\w.+-]+@[\w-]+\.[a-z]{2,}\b"),
            ("markdown_image_exfil", r"!\[[^\]]*\]\(\s*https?://[^)]*(?:\?|&)[\w-]+="),
            ("curl_wget", r"\b(?:curl|wget|fetch)\b[^\n]{0,100}https?://"),
            ("exfiltrate_word", r"\bexfiltrat\w*"),
            ("de_reveal", r"\b(?:zeige|verrate|gib)\b.{0,30}\b(?:passwort|geheimnis|anweisungen|prompt)\b"),
        ),
    ),
    PatternGroup(
        "memory_attack",
        0.8,
        (
            (
                "remember_forever",
                r"\b(?:remember|memorize|store|save|note)\b.{0,40}\b(?:forever|permanently|for all future|in (?:your )?(?:long[- ]term )?memory|every (?:session|conversation|time))\b",
            ),
            (
                "future_conversations",
                r"\b(?:in|for|across) (?:all )?(?:future|subsequent|later) (?:conversations|sessions|chats|responses)\b",
            ),
            (
                "update_memory",
                r"\b(?:update|modify|overwrite|edit|write to|append to)\b.{0,30}\b(?:your )?(?:memory|SOUL\.md|MEMORY\.md|profile|persona|knowledge base)\b",
            ),
            ("always_from_now", r"\balways\b.{0,30}\b(?:from now on|going forward|henceforth|in the future)\b"),
            ("schedule", r"\b(?:cron(?:tab)?|scheduled? task|every \d+ (?:minutes?|hours?|days?))\b"),
            ("persist_instruction", r"\b(?:persist|persistent)\b.{0,30}\b(?:instruction|rule|behaviou?r|memory)\b"),
            ("de_remember", r"\b(?:merke dir|speichere|behalte)\b.{0,40}\b(?:immer|dauerhaft|für immer|zukünftig)\b"),
        ),
    ),
    PatternGroup(
        "encoding_evasion",
        0.6,
        (
            ("base64_blob", r"(?:[A-Za-z0-9+/]{4}){12,}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"),
            (
                "decode_and_follow",
                r"\b(?:decode|decrypt|translate|deobfuscate)\b.{0,40}\b(?:and|then)\b.{0,20}\b(?:follow|execute|run|obey|do)\b",
            ),
            ("encoding_named", r"\b(?:base64|rot13|rot-13|hex[- ]encoded|morse code|leetspeak|caesar cipher)\b"),
            ("zero_width", "[\u200b\u200c\u200d\u2060\ufeff]"),
            ("bidi_override", "[\u202a-\u202e\u2066-\u2069]"),
            (
                "special_tokens",
                r"(?:<\|(?:im_start|im_end|endoftext|system)\|>|\[/?INST\]|<<SYS>>|\[\[system\]\]|###\s*(?:system|instruction)\b)",
            ),
            ("html_comment", r"<!--.{0,200}?(?:ignore|instruction|system|assistant).{0,200}?-->"),
            (
                "hidden_markup",
                r"<\s*(?:script|iframe)\b|style\s*=\s*[\"'][^\"']*(?:display\s*:\s*none|font-size\s*:\s*0)",
            ),
            ("spaced_letters", r"\b(?:i\s+g\s+n\s+o\s+r\s+e|s\s+y\s+s\s+t\s+e\s+m)\b"),
        ),
    ),
)


class HeuristicDetector(DetectorBase):
    """D1: max group weight over matching patterns; ``explain`` lists which patterns fired. A regex reads
    the whole text, so D1 is not windowed (one window per text; over-long and blank texts as in
    :class:`DetectorBase`)."""

    name = "D1 Heuristic"

    def __init__(self, groups: Sequence[PatternGroup] = GROUPS) -> None:
        self.groups = tuple(groups)
        self._compiled = tuple(
            (group, tuple((label, re.compile(rx, re.IGNORECASE | re.DOTALL)) for label, rx in group.patterns))
            for group in self.groups
        )

    @property
    def n_patterns(self) -> int:
        return sum(len(group.patterns) for group in self.groups)

    def explain(self, text: str) -> list[tuple[str, str]]:
        """(group, pattern label) of every pattern that matches, in declaration order."""
        return [(group.name, label) for group, patterns in self._compiled for label, rx in patterns if rx.search(text)]

    def _score_one(self, text: str) -> float:
        best = 0.0
        for group, patterns in self._compiled:
            if group.weight > best and any(rx.search(text) for _, rx in patterns):
                best = group.weight
        return best

    def _score(self, texts: list[str]) -> np.ndarray:
        return np.array([self._score_one(text) for text in texts], dtype=np.float64)


@detector_plugin("heuristic", summary="D1: weighted groups of injection patterns, no model")
def _load_heuristic(argument: str, tracking_uri: str | None) -> tuple[HeuristicDetector, str]:
    heuristic = HeuristicDetector()
    return heuristic, f"heuristic:{heuristic.name}"
