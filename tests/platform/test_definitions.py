"""The code location loads; every asset is grouped and described; the library stays Dagster-free."""

from __future__ import annotations

import ast
from pathlib import Path

from dagster import AssetKey

from assets.definitions import defs

LAYER = {"assets", "resources", "sensors"}  # the Dagster layer: it imports the library, never the reverse
REPO = Path(__file__).resolve().parents[2]


def test_every_asset_has_a_group_and_description() -> None:
    repository = defs.get_repository_def()
    keys = repository.asset_graph.get_all_asset_keys()
    assert len(keys) >= 15
    for key in keys:
        node = repository.asset_graph.get(key)
        assert node.group_name and node.group_name != "default", key
        assert node.description and len(node.description) > 20, key


def test_every_asset_group_has_its_domains_mlflow_experiment() -> None:
    """A group missing from DOMAIN_EXPERIMENTS would send its runs to the catch-all experiment, away from the runs
    they are compared with."""
    from rvu_pipelines.tracking import DOMAIN_EXPERIMENTS

    graph = defs.resolve_asset_graph()
    groups = {graph.get(key).group_name for key in graph.get_all_asset_keys()}
    assert sorted(groups - set(DOMAIN_EXPERIMENTS)) == []


def test_default_job_selects_every_asset_with_checks() -> None:
    repository = defs.get_repository_def()
    job = repository.get_job("default_profile_job")
    selected = job.asset_layer.executable_asset_keys
    partitioned = {
        key
        for key in repository.asset_graph.get_all_asset_keys()
        if repository.asset_graph.get(key).partitions_def is not None
    }
    assert partitioned  # the per-incident recovery assets run in recovery_job, started by the sensor
    detectors = {
        key
        for key in repository.asset_graph.get_all_asset_keys()
        if repository.asset_graph.get(key).group_name == "detectors"
    }
    assert len(detectors) == 14  # trained and evaluated by detectors_job, incl. the LODO table
    assert {key.to_user_string() for key in partitioned} >= {"attack_cell"}  # benchmark × attack.defense cells
    # D2 and D4 on deepset and the production detector are trained and registered by the default job, so MLflow has
    # models after `make run` and the consumers find rvu-injection-detector@production
    default_detectors = {
        key
        for key in detectors
        if key.to_user_string()
        in (
            "detector_corpus_deepset",
            "detector_corpus_jailbreak",
            "detector_d2_deepset",
            "detector_d4_deepset",
            "detector_production",
        )
    }
    assert len(default_detectors) == 5
    # full studies run in their own jobs; their sampled siblings (e.g. memory_poisoning_sample) are in the default job
    full_studies = {
        AssetKey(name)
        for name in (
            "memory_poisoning_study",
            "memory_poisoning_seeds",
            "memory_poisoning_agent",
            "memory_poisoning_synonym",
            "detector_validity",
            "adapter_gate_evaluation",
            "adapter_gate_aware",
            "adapter_private_draw_table",
            "adapter_trigger_search",
            "adapter_membership",
            "wmdp_cyber_evaluation",
            "adapter_incidents",
            "adapter_tool_use",
            "adapter_eviction_runtime",
            "adapter_certificates",
            "attack_table_full",
            "spectral_study",
            "spectral_controls",
            "spectral_hfer_cost",
        )
    }
    assert AssetKey("adapter_sample") in selected
    assert AssetKey("memory_poisoning_sample") in selected
    # the benchmark samples (minutes of LLM inference) run in the nightly sweep; Table 1 covers every benchmark here
    assert AssetKey("attack_table_1") in selected
    nightly_only = {AssetKey("attack_benchmark_samples")}
    everything = set(repository.asset_graph.get_all_asset_keys())
    assert selected == (everything - partitioned - detectors - full_studies - nightly_only) | default_detectors
    assert len(list(job.asset_layer.asset_graph.asset_check_keys)) >= 14


def test_library_never_imports_dagster_nor_the_dagster_layer() -> None:
    offenders = []
    for path in sorted((REPO / "rvu_pipelines").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(
                name == "dagster" or name.startswith(("dagster.", "dagster_")) or name.split(".")[0] in LAYER
                for name in names
            ):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def test_detectors_job_trains_every_detector_from_its_data() -> None:
    job = defs.get_repository_def().get_job("detectors_job")
    selected = {key.to_user_string() for key in job.asset_layer.executable_asset_keys}
    assert {f"detector_evaluation_{c}" for c in ("deepset", "jailbreak", "combined")} <= selected
    assert {"deepset_prompt_injections", "awesome_chatgpt_prompts", "trustair_jailbreaks"} <= selected
    assert not any(key.startswith(("incident_", "memory_")) for key in selected)


def test_attack_cells_are_partitioned_by_benchmark_and_arm() -> None:
    """Dagster takes two dimensions at most: attack and defense share the ``arm`` dimension, ``<attack>.<defense>``."""
    from assets.attacks import arm_key, parse_arm
    from rvu_pipelines.scenarios.axes import ATTACKS, BENCHMARKS, DEFENSES

    partitions = defs.get_repository_def().asset_graph.get(AssetKey("attack_cell")).partitions_def
    assert partitions is not None
    keys = partitions.get_partition_keys()
    assert len(keys) == (1 + len(BENCHMARKS)) * len(ATTACKS) * len(DEFENSES)
    assert "native.vanilla|canonical" in keys and "adaptive.rvu_v2|agentdojo" in keys
    parsed = partitions.get_partition_key_from_str("forged_turn.rvg|bipia_email").keys_by_dimension
    assert parsed == {"arm": "forged_turn.rvg", "benchmark": "bipia_email"}
    assert parse_arm(arm_key("forged_turn", "rvg_oracle")) == ("forged_turn", "rvg_oracle")


def test_loading_the_code_location_imports_neither_torch_nor_agentdojo():
    """Every Dagster process (webserver, daemon, each step of a multiprocess run) imports the code location first;
    torch and AgentDojo (with its model-provider SDKs) cost seconds each and are needed only inside asset bodies."""
    import subprocess
    import sys

    probe = (
        "import sys, assets.definitions; "
        "print(sorted(m for m in ('torch', 'agentdojo', 'transformers') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
