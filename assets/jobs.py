"""Every job of the code location, in one place (definitions.py composes them with assets, sensors and
schedules). Every job runs its steps with ``assets.executors.JOB_EXECUTOR``: in-process by default (torch and
transformers load once), a bounded multiprocess executor in the scale profile."""

from dagster import AssetSelection, define_asset_job

from assets.executors import JOB_EXECUTOR
from assets.partitions import (
    adapter_partitions,
    cell_partitions,
    incident_partitions,
    poisoning_partitions,
    spectral_partitions,
)

# The detectors a newcomer's MLflow registry should hold after `make run`: D2 and D4 trained on deepset, and the
# production detector the classifier defense, the monitor and recovery use by alias. The three-corpus study
# with its evaluations stays in detectors_job.
DEFAULT_DETECTORS = AssetSelection.assets(
    "detector_corpus_deepset",
    "detector_corpus_jailbreak",
    "detector_d2_deepset",
    "detector_d4_deepset",
    "detector_production",
)

# Studies too long for `make run` (their sampled siblings are in the default job) and their partitioned cells.
FULL_STUDIES = AssetSelection.assets(
    "memory_poisoning_study",
    "memory_poisoning_seeds",
    "memory_poisoning_agent",
    "memory_poisoning_cell",
    "spectral_kill_switch_cell",
    "spectral_study",
    "spectral_controls",
    "spectral_hfer_cost",
    "adapter_zoo",
    "adapter_gate_evaluation",
    "adapter_membership",
    "wmdp_cyber_evaluation",
    "adapter_incidents",
    "adapter_tool_use",
    "adapter_eviction_runtime",
    "attack_table_full",
)

# Random scenarios of every benchmark under every defense: minutes of LLM inference. Table 1's canonical
# 10 already cover every benchmark x defense in the default job, so the samples run in the nightly sweep (and on
# their own from the UI) rather than in `make run`.
SWEEP_SAMPLES = AssetSelection.assets("attack_benchmark_samples")

default_profile_job = define_asset_job(
    "default_profile_job",
    # Everything that finishes in minutes. Incident partitions are recovered by recovery_job (sensor-started);
    # training and evaluating the five detectors on three corpora takes tens of minutes of CPU: detectors_job.
    # attack_cell is partitioned (benchmark × attack.defense): backfills and the UI; the default job runs Table 1.
    selection=(
        AssetSelection.all()
        - AssetSelection.groups("recovery", "detectors")
        - AssetSelection.assets("attack_cell")
        - FULL_STUDIES
        - SWEEP_SAMPLES
    )
    | DEFAULT_DETECTORS,
    executor_def=JOB_EXECUTOR,
    description="Materialize every asset of the default profile (data sets, models, smoke runs, "
    "reproductions, memory monitor evaluation, D2/D4 trained and registered on deepset, attack Table 1, the "
    "memory-poisoning, spectral and adapter samples) with checks; the benchmark samples run in the nightly sweep.",
)

attack_cells_job = define_asset_job(
    "attack_cells_job",
    selection=AssetSelection.assets("attack_cell"),
    partitions_def=cell_partitions,
    executor_def=JOB_EXECUTOR,
    description="Attack-table cells (partitions benchmark × arm, an arm being <attack>.<defense>, e.g. "
    "`native.rvg|canonical`): launch or backfill any cell from the UI; config `limit` sets the sample size "
    "(null = the whole benchmark).",
)

detectors_job = define_asset_job(
    "detectors_job",
    selection=AssetSelection.groups("detectors").upstream(),
    executor_def=JOB_EXECUTOR,
    description="Seed 002 §5-6: build the three corpora, train and register D2/D4 per corpus in MLflow, and "
    "evaluate D1-D5 with bootstrap CIs (tens of minutes of CPU; `make detectors`).",
)

nightly_regression_job = define_asset_job(
    "nightly_regression_job",
    selection=AssetSelection.assets("attack_table_1") | SWEEP_SAMPLES,
    executor_def=JOB_EXECUTOR,
    tags={"rvu/sweep": "nightly"},
    description="Re-run the canonical attack cells (Table 1) and check them against configs/golden/ "
    "(tolerances in configs/regression.yaml), and a fixed-seed sample of every benchmark under every defense. "
    "MLflow runs carry the tag rvu_sweep=nightly.",
)

memory_poisoning_job = define_asset_job(
    "memory_poisoning_job",
    selection=AssetSelection.assets("memory_poisoning_study", "memory_poisoning_agent").upstream(),
    executor_def=JOB_EXECUTOR,
    description="Seed 003 in full at |M| = 1,000 (the attack-defense matrix with CIs, the adaptive attacks and the "
    "hybrid check, the SIR figure) and MINJA through the real agent (`make memory-poisoning`).",
)

memory_poisoning_seeds_job = define_asset_job(
    "memory_poisoning_seeds_job",
    selection=AssetSelection.assets("memory_poisoning_seeds").upstream(),
    executor_def=JOB_EXECUTOR,
    description="Seed 003's matrix over five splits x seeds at |M| = 1,000 and full, mean ± sd and the Bonferroni "
    "comparisons per seed (`make memory-poisoning-seeds`; about an hour on 2 cores).",
)

memory_poisoning_cells_job = define_asset_job(
    "memory_poisoning_cells_job",
    selection=AssetSelection.assets("memory_poisoning_cell"),
    partitions_def=poisoning_partitions,
    executor_def=JOB_EXECUTOR,
    description="One memory-poisoning attack class against one memory regime per partition (backfill from the UI).",
)

spectral_cells_job = define_asset_job(
    "spectral_cells_job",
    selection=AssetSelection.assets("spectral_kill_switch_cell"),
    partitions_def=spectral_partitions,
    executor_def=JOB_EXECUTOR,
    description="Seed 004's kill switch, one data source × model profile per partition (e.g. `tiny|bipia`): "
    "calibrated on 20 and on all calibration examples, held-out AUROC / TPR / FPR, plots in MLflow; "
    "config `limit` sets the examples per cell.",
)

spectral_study_job = define_asset_job(
    "spectral_study_job",
    selection=AssetSelection.groups("spectral_study").upstream(),
    executor_def=JOB_EXECUTOR,
    description="Seed 004 in full (`make spectral`, configs/runs/spectral.yaml): the switch against its baselines "
    "with the leave-one-dataset-out table, the switch under its controls, and the inline hfer defense's cost; "
    "hours of CPU, features cached by a digest of the examples.",
)

adapter_zoo_job = define_asset_job(
    "adapter_zoo_job",
    selection=AssetSelection.assets("adapter_zoo").upstream(),
    partitions_def=adapter_partitions,
    executor_def=JOB_EXECUTOR,
    description="Train the LoRA adapter zoo, one adapter per partition (configs/adapter_zoo.yaml), with the data "
    "sets and model it reads (seconds); minutes of CPU per adapter, unchanged adapters reused (`make adapters` "
    "launches every partition, then adapter_study_job).",
)

adapter_study_job = define_asset_job(
    "adapter_study_job",
    selection=AssetSelection.groups("adapter_study").upstream() - AssetSelection.assets("adapter_zoo"),
    executor_def=JOB_EXECUTOR,
    description="Seed 000 E4-E7 and E1 with adapters over the trained zoo (`make adapters`): the gate and "
    "influence (the load gate's screening table), membership loaded vs evicted, WMDP-cyber on all 1,987 items, "
    "incidents with a harmful adapter loaded part-way (D1 and oracle seeds), the tool-use adapter's utility and "
    "ASR, and eviction on the agent's runtime; hours of CPU, model calls replayed from the response cache.",
)

recovery_reproductions_job = define_asset_job(
    "recovery_reproductions_job",
    selection=AssetSelection.groups("recovery_reproductions"),
    executor_def=JOB_EXECUTOR,
    description="Re-run the paper's E2 (closure), E3 (FROC) and E8 (certificate audit) reproductions: three "
    "independent steps, seconds each (also the smallest job to try an executor or instance on).",
)

attack_table_job = define_asset_job(
    "attack_table_job",
    selection=AssetSelection.assets("attack_table_full"),
    executor_def=JOB_EXECUTOR,
    description="The attack table on held-out scenarios: benchmark × attack × defense with controls, the GCG "
    "universal string and the adaptive attacks, paired comparisons (`make attacks`; config `per_benchmark`).",
)

recovery_job = define_asset_job(
    "recovery_job",
    selection=AssetSelection.groups("recovery"),
    partitions_def=incident_partitions,
    executor_def=JOB_EXECUTOR,
    description="Recover from one incident log (a partition of `incidents`): ingest, closure, risk, tiers, "
    "certificate.",
    tags={"rvu/provenance_store": "default"},  # the instance limits this tag to one run at a time
)

JOBS = [
    default_profile_job,
    recovery_reproductions_job,
    attack_cells_job,
    attack_table_job,
    detectors_job,
    nightly_regression_job,
    memory_poisoning_job,
    memory_poisoning_seeds_job,
    memory_poisoning_cells_job,
    spectral_cells_job,
    spectral_study_job,
    adapter_zoo_job,
    adapter_study_job,
    recovery_job,
]
