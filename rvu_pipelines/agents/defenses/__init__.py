"""The six defenses of the attack table (vanilla, classifier, fath, rvg, rvu_v1, rvu_v2), each an
AgentDojo pipeline over the same LLM element; ``build_pipeline`` (builder.py) assembles one.

Split where the code divides: ``allowlist`` (the RVG tool policy), ``fath`` (keys and HMAC tags),
``elements`` (the pipeline elements and the episode trace) and ``builder`` (settings and assembly).
"""

from rvu_pipelines.agents.defenses.allowlist import (
    ALLOWLIST_BENCHMARKS,
    ToolAllowlist,
    ToolPolicy,
    load_tool_allowlist,
    tool_allowlist_path,
)
from rvu_pipelines.agents.defenses.builder import (
    GATED_DEFENSES,
    DefenseSettings,
    PrefilledToolCalls,
    build_pipeline,
)
from rvu_pipelines.agents.defenses.elements import (
    FILTERED_NOTICE,
    BlockedCall,
    DefensePipeline,
    DetectorFilter,
    EpisodeTrace,
    FathInitQuery,
    FathResponse,
    FathUntrustedTools,
    FathVerify,
    ToolGate,
)
from rvu_pipelines.agents.defenses.fath import (
    FATH_KEY_BYTES,
    FATH_POLICY,
    FATH_TAG_HEX,
    authenticated_response,
    defang,
    fath_key_path,
    fath_tag,
    load_or_create_fath_key,
    verify_instruction,
    wrap_instruction,
)
from rvu_pipelines.scenarios.axes import DEFENSES, RECOVERING_DEFENSES

__all__ = [
    "ALLOWLIST_BENCHMARKS",
    "DEFENSES",
    "FATH_KEY_BYTES",
    "FATH_POLICY",
    "FATH_TAG_HEX",
    "FILTERED_NOTICE",
    "GATED_DEFENSES",
    "RECOVERING_DEFENSES",
    "BlockedCall",
    "DefensePipeline",
    "DefenseSettings",
    "DetectorFilter",
    "EpisodeTrace",
    "FathInitQuery",
    "FathResponse",
    "FathUntrustedTools",
    "FathVerify",
    "PrefilledToolCalls",
    "ToolAllowlist",
    "ToolGate",
    "ToolPolicy",
    "authenticated_response",
    "build_pipeline",
    "defang",
    "fath_key_path",
    "fath_tag",
    "load_or_create_fath_key",
    "load_tool_allowlist",
    "tool_allowlist_path",
    "verify_instruction",
    "wrap_instruction",
]
