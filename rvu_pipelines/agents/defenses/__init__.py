"""The defenses of the attack table (vanilla, classifier, hfer, fath, rvg, rvg_oracle, rvu_v1, rvu_v2), each an
AgentDojo pipeline over the same LLM element; ``build_pipeline`` (builder.py) assembles one.

Split where the code divides: ``allowlist`` (the RVG tool policy), ``rvg_policy`` (the realistic gate's
per-suite plans), ``fath`` (secrets, tags and the output parser), ``hfer`` (the spectral kill switch),
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
    request_planner,
)
from rvu_pipelines.agents.defenses.elements import (
    FILTERED_NOTICE,
    BlockedCall,
    DefenseAbort,
    DefensePipeline,
    DetectorFilter,
    EpisodeTrace,
    FathInitQuery,
    FathResponse,
    FathSession,
    FathUntrustedTools,
    FathVerify,
    ToolGate,
)
from rvu_pipelines.agents.defenses.fath import (
    FATH_KEY_BYTES,
    FATH_POLICY,
    FATH_REFUSAL,
    FATH_TAG_HEX,
    authorised_section,
    defang,
    episode_secret,
    fath_key_path,
    load_or_create_fath_key,
    message_tag,
    response_sections,
    verify_instruction,
    wrap_data,
    wrap_instruction,
)
from rvu_pipelines.agents.defenses.rvg_policy import (
    RvgPolicies,
    SuitePolicy,
    ToolPlan,
    load_rvg_policies,
    rvg_policies_path,
)
from rvu_pipelines.scenarios.axes import DEFENSE_NOTES, DEFENSES, RECOVERING_DEFENSES

__all__ = [
    "ALLOWLIST_BENCHMARKS",
    "DEFENSES",
    "DEFENSE_NOTES",
    "FATH_KEY_BYTES",
    "FATH_POLICY",
    "FATH_REFUSAL",
    "FATH_TAG_HEX",
    "FILTERED_NOTICE",
    "GATED_DEFENSES",
    "RECOVERING_DEFENSES",
    "BlockedCall",
    "DefenseAbort",
    "DefensePipeline",
    "DefenseSettings",
    "DetectorFilter",
    "EpisodeTrace",
    "FathInitQuery",
    "FathResponse",
    "FathSession",
    "FathUntrustedTools",
    "FathVerify",
    "PrefilledToolCalls",
    "RvgPolicies",
    "SuitePolicy",
    "ToolAllowlist",
    "ToolGate",
    "ToolPlan",
    "ToolPolicy",
    "authorised_section",
    "build_pipeline",
    "defang",
    "episode_secret",
    "fath_key_path",
    "load_or_create_fath_key",
    "load_rvg_policies",
    "load_tool_allowlist",
    "message_tag",
    "request_planner",
    "response_sections",
    "rvg_policies_path",
    "tool_allowlist_path",
    "verify_instruction",
    "wrap_data",
    "wrap_instruction",
]
