# Quick start (README): `make run` sets up and materializes everything; `make test` sets up and tests.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
# the state folder (outputs, MLflow store, caches) as the platform finds it: RVU_HOME when set, else .rvu
STATE := $(abspath $(or $(RVU_HOME),.rvu))
export DAGSTER_HOME := $(CURDIR)/.dagster_home
# The offline data mirror beside the checkout is the embedded default; set RVU_DATA_MIRROR= (empty)
# to read the public sources instead.
RVU_DATA_MIRROR ?= $(if $(wildcard $(CURDIR)/../shared/data),$(abspath $(CURDIR)/../shared/data),)
export RVU_DATA_MIRROR
export TOKENIZERS_PARALLELISM := false
# Container images set PYTHONDONTWRITEBYTECODE; under make, Python and pytest keep their bytecode caches (both
# git-ignored), so a test worker, a Dagster step or an `rvu` call does not compile the project and re-write the
# test modules' assertions again in every process
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup run attacks attacks-full scale-up scale-down scale-status doctor detectors detector-validity memory-poisoning memory-poisoning-seeds memsad-synonym minja-agent spectral adapters lint format test test-slow test-all dev mlflow-ui bench bench-report bench-closure bench-stores bench-sweep bench-monitor bench-detectors bench-agent bench-cell-order bench-llama bench-llm-throughput bench-memsad bench-spectral bench-gate regress report docs docs-serve test-fast clean

setup:
	@bash scripts/setup.sh

run: setup
	$(BIN)/dg launch --job default_profile_job -m assets.definitions
	$(BIN)/rvu summary
	$(BIN)/python scripts/run_timings.py --job default_profile_job

# Seed 002 §5-6: train, register (MLflow) and evaluate D1-D5 on the three corpora (tens of minutes of CPU)
detectors: setup
	$(BIN)/dg launch --job detectors_job -m assets.definitions

# Detectors off their training distribution: D1-D5, the production detector (leave-one-source-out selection) and a
# length control on held-out sources, the over-defense set, benign tool outputs, buried injections, German, latency
detector-validity: setup
	$(BIN)/dg launch --job detector_validity_job -m assets.definitions
	cat $(STATE)/detectors/detector_validity.md

# Seed 000 Table 1 on held-out scenarios: benchmark × attack (controls, native, forged turn, the GCG universal string,
# adaptive) × defense, paired comparisons; reuses the stored strings in configs/attacks (never re-optimises them).
# ATTACKS_CONFIG: a run config (e.g. configs/runs/attacks_per_scenario.yaml; `per_benchmark` sets the sample, the
# published table: 100); resumable. Each config's table stays in .rvu/attacks/full/<profile>/<its name>/; the newest
# is printed
ATTACKS_CONFIG ?=
attacks: setup
	$(BIN)/dg launch --job attack_table_job -m assets.definitions $(if $(ATTACKS_CONFIG),--config $(ATTACKS_CONFIG))
	cat "$$(ls -t $(STATE)/attacks/full/*/*/table.md | head -1)"

# The whole published attack table in one command: every run the committed golden file was made from (its `runs`;
# each resumes from its saved episodes), each run's wall time, then every golden cell held to what they produced
# (scripts/full_golden.py --check: exit 1 when a cell moved or is missing)
attacks-full: setup
	@runs="$$($(BIN)/python scripts/full_golden.py --list-runs)" || exit 2; total=$$SECONDS; \
	for run in $$runs; do \
		start=$$SECONDS; \
		$(BIN)/dg launch --job attack_table_job -m assets.definitions --config configs/runs/attacks_$$run.yaml || exit 1; \
		echo "attacks-full: run $$run took $$(( SECONDS - start )) s"; \
	done; \
	echo "attacks-full: every run took $$(( SECONDS - total )) s in all"; \
	$(BIN)/python scripts/full_golden.py --check

# Seed 003 in full (|M| = 1,000): attack-defense matrix with CIs, adaptive attacks + hybrid check, SIR figure
memory-poisoning: setup
	$(BIN)/dg launch --job memory_poisoning_job -m assets.definitions
	cat $(STATE)/memory_poisoning/study/paper_table.md

# Seed 003's matrix over five splits x seeds at |M| = 1,000 and full: mean ± sd, Bonferroni comparisons (about an hour)
memory-poisoning-seeds: setup
	$(BIN)/dg launch --job memory_poisoning_seeds_job -m assets.definitions
	cat $(STATE)/memory_poisoning/seeds/seeds.md $(STATE)/memory_poisoning/seeds/seeds_comparisons.md

# Seed 003's synonym loophole as the seed ran it: 60 poisons, no substitution budget, ASR-R measured (tens of minutes)
memsad-synonym: setup
	$(BIN)/dg launch --job memsad_synonym_job -m assets.definitions
	cat $(STATE)/memory_poisoning/synonym/synonym_study.md

# MINJA through the real agent on llama.cpp (its memory behind the monitor): ISR, ASR-R, ASR-A, control, MEMSAD arm
minja-agent: setup
	$(BIN)/dg launch --job minja_agent_job -m assets.definitions
	cat $(STATE)/memory_poisoning/agent/minja_agent.md

# Seed 004 in full: HFER / spectral features per layer on four real sets, 20/50/200 calibration, histograms, and the
# kill switch against Attention Tracker, perplexity and D1-D5 (incl. leave-one-dataset-out); then the same switch
# under its controls (sink-free graphs, pairs, length, the length-matched clean partner, a per-head probe left one
# set out) and the inline hfer defense's cost on AgentDojo's tool outputs; hours of CPU
spectral: setup
	$(BIN)/dg launch --job spectral_study_job -m assets.definitions --config configs/runs/spectral.yaml
	cat $(STATE)/spectral/comparison.md $(STATE)/spectral/controls/controls.md $(STATE)/spectral/hfer_cost.md

# Seed 000 E4-E7 on real LoRA adapters: train the zoo (configs/adapter_zoo.yaml; unchanged adapters reused), the gate
# and influence over it, membership loaded vs evicted, WMDP-cyber on all 1,987 items, E1 sessions with a harmful
# adapter loaded part-way (RVU v1 vs v2), the tool-use adapter's utility/ASR, eviction on the agent's runtime (what
# lingers: served answers, cached answers, fused weights); hours of CPU from scratch. Each adapter is one partition
# of adapter_zoo_job (a run per adapter, reused while unchanged), then the study is adapter_study_job
adapters: setup
	$(BIN)/rvu adapters plan
	ids="$$($(BIN)/rvu adapters plan --ids)" && [ -n "$$ids" ] || { echo "no zoo adapters listed" >&2; exit 1; }; \
	for id in $$ids; do \
		$(BIN)/dg launch --job adapter_zoo_job --partition $$id -m assets.definitions || exit 1; \
	done
	$(BIN)/dg launch --job adapter_study_job -m assets.definitions
	cd $(STATE)/adapter_study && cat gate.md gate_aware/gate_aware.md trigger_search/trigger_search.md incidents.md oracle/incidents.md \
		tool_use.md eviction_runtime/eviction_runtime.md certificates/certificates.md

# The local scale profile: PostgreSQL, MLflow server, Dagster webserver + daemon, Redis + celery workers on
# loopback, data under .rvu/scale; `source .rvu/scale/scale.env` to use it from a shell. Idempotent; ports and
# worker count: RVU_SCALE_* (`rvu settings`)
scale-up: setup
	@bash scripts/scale_setup.sh
	$(BIN)/rvu scale up

scale-down: setup
	$(BIN)/rvu scale down

scale-status: setup
	$(BIN)/rvu scale status

# Is this machine able to run the platform? CPU, llama.cpp build + settings, models, one generation, MLflow, Dagster
doctor: setup
	$(BIN)/rvu doctor

# ruff (lint + format check, line length 120) and mypy, as configured in pyproject.toml; CI runs it first
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# one pytest-xdist worker per core this process may use (at most 4: each worker loads its own models); a test
# module stays on one worker, so its module fixtures are built once, and modules sharing costly state share one
# (tests/conftest.py SHARED_WORKER)
TEST_WORKERS ?= $(shell python3 -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))' 2>/dev/null || echo 1)

test: setup
	$(BIN)/pytest -m "not slow and not network" -n $(TEST_WORKERS) --dist loadgroup

# the inner loop (under 2 minutes): every test that loads no model, trains nothing and starts no server
# (tests/conftest.py --fast); CI runs the full default suite
test-fast: setup
	$(BIN)/pytest -m "not slow and not network" --fast -q -n $(TEST_WORKERS) --dist loadgroup

test-slow: setup
	$(BIN)/pytest -m slow

test-all: setup
	$(BIN)/pytest

dev: setup
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

mlflow-ui: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(STATE)/mlflow.db -h 127.0.0.1 -p 5000

# every bench below, then bench-report's one table of all their ratios (run by the recipe: last even under -j)
bench: bench-closure bench-monitor bench-detectors bench-agent bench-cell-order bench-llama bench-llm-throughput bench-memsad bench-spectral bench-gate bench-stores
	$(BIN)/python benchmarks/bench_report.py

# every bench's headline ratios in one table, from the JSON each leaves in .rvu/bench/ (`make bench`'s last step);
# also writes .rvu/bench/performance.md, README's performance table
bench-report: setup
	$(BIN)/python benchmarks/bench_report.py

bench-closure: setup
	$(BIN)/python benchmarks/bench_closure.py

# the provenance store's engines: DuckDB vs PostgreSQL bulk load + graph read at 10^6, 10 recoveries in parallel workers
bench-stores: setup
	$(BIN)/python benchmarks/bench_store_engines.py

# attack table + detector sweep: embedded vs the scale profile (multiprocess 1/2 runs, celery 2 workers), results
# compared; needs RVU_DATA_MIRROR (set above when ../shared/data exists); tens of minutes of CPU
bench-sweep: setup
	$(BIN)/python benchmarks/bench_scale_sweep.py

bench-monitor: setup
	$(BIN)/python benchmarks/bench_monitor.py

bench-detectors: setup
	$(BIN)/python benchmarks/bench_detectors.py

# MEMSAD write scoring: batched writes/s and one write's latency beside the embedding cost (seed 003)
bench-memsad: setup
	$(BIN)/python benchmarks/bench_memsad.py

# the spectral statistic per layer at 512 tokens, and the kill-switch gate vs a plain forward pass (seed 004)
bench-spectral: setup
	$(BIN)/python benchmarks/bench_spectral.py

# the adapter load gate on an adapter it has no screening row for: each part's seconds at N threads and at one, the
# same adapter checked again from its stored scores, and the first verdict against the 10 s goal (seed 000 E4)
bench-gate: setup
	$(BIN)/python benchmarks/bench_gate.py

# cold vs KV-prefix-reused vs response-cached LLM time per agent scenario
bench-agent: setup
	$(BIN)/python benchmarks/bench_agent_speed.py

# the attack table's episode order: cell by cell vs scenario by scenario (shared prompt prefixes), same rows
bench-cell-order: setup
	$(BIN)/python benchmarks/bench_cell_order.py

# llama.cpp prompt / generation tokens/s: portable vs native build, extra buffer types off vs on
bench-llama: setup
	$(BIN)/python benchmarks/bench_llama_cpu.py

# llama.cpp's own prompt/generation tokens/s (llama-bench style) vs the harness's, and the knobs (minutes)
bench-llm-throughput: setup
	$(BIN)/python benchmarks/bench_llm_throughput.py

# the nightly comparison outside Dagster: canonical attack cells vs configs/golden/
regress: setup
	$(BIN)/rvu regress

# the result pages (docs/results/) from the studies' latest tables in .rvu, each with its stamp
report: setup
	$(BIN)/rvu report

# the documentation site (MkDocs + Material): docs/reference/ regenerated from the code, then a strict build into
# site/ (a broken link or anchor fails it)
docs: setup
	$(BIN)/python scripts/docs_reference.py
	$(BIN)/mkdocs build --strict --site-dir site

# the site on http://127.0.0.1:8000, rebuilt as pages change
docs-serve: setup
	$(BIN)/python scripts/docs_reference.py
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf .rvu .dagster_home
