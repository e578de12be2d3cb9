#!/usr/bin/env bash
# Idempotent set-up of the project's virtual environment (.venv).
#
# Order matters: torch goes in first as the pinned CPU build, so nothing that depends on it can pull
# a multi-GB CUDA build; then llama-cpp-python from a wheel built for a portable CPU target
# (scripts/build_llama_cpp.py: x86-64-v3, no AVX-512/AMX, cached in ~/.cache/rvu/wheels by its build
# flags; minutes of CPU the first time, seconds after); then uv installs the project (editable)
# under requirements/constraints.txt. A stamp of the inputs makes a second run skip finished work.
# Set-up ends with one llama.cpp generation in a child process: if llama.cpp crashes on this CPU,
# set-up fails naming the signal, the CPU features and the switch to try (RVU_LLAMA_CPU, RVU_LLAMA_EXTRA_BUFTS).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${RVU_VENV:-.venv}
PYTHON=${RVU_PYTHON:-$(command -v python3.11 || command -v python3)}
TORCH_VERSION=2.13.0
UV_VERSION=0.13.8
STAMP="$VENV/.rvu-setup-stamp"
# the llama.cpp build target (portable level or native + this CPU's flags) is part of what set-up made
llama_build=$("$PYTHON" scripts/build_llama_cpp.py key)
inputs_hash=$( (cat pyproject.toml requirements/constraints.txt scripts/setup.sh scripts/build_llama_cpp.py; \
                echo "$llama_build") | sha256sum | cut -d' ' -f1)

# DAGSTER_HOME lives in the project (git-ignored) so runs persist for the UI; telemetry off.
DAGSTER_HOME_DIR=${DAGSTER_HOME:-$PWD/.dagster_home}
mkdir -p "$DAGSTER_HOME_DIR"
# Recovery runs share one provenance store: the instance runs at most one of them at a time.
[ -f "$DAGSTER_HOME_DIR/dagster.yaml" ] || cat > "$DAGSTER_HOME_DIR/dagster.yaml" <<'YAML'
telemetry:
  enabled: false
concurrency:
  runs:
    tag_concurrency_limits:
      - key: rvu/provenance_store
        limit: 1
YAML

# One generation in a child process (remembered once it passed for this model, build, settings and CPU).
smoke_generation() {
  if ! "$VENV/bin/python" -m rvu_pipelines.models.native_probe --cached; then
    echo "set-up: FAILED: llama.cpp cannot generate on this machine (details above). Nothing else is wrong" \
         "with the set-up; after changing a switch, run 'make setup' again, then 'rvu doctor'." >&2
    exit 1
  fi
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$inputs_hash" ] && [ -x "$VENV/bin/rvu" ]; then
  echo "set-up: $VENV is up to date (delete $STAMP to force a reinstall)"
  smoke_generation
  exit 0
fi

echo "set-up: preparing $VENV with $PYTHON"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"

have_torch=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [[ "$have_torch" != "$TORCH_VERSION"* ]]; then
  # pip finds the CPU wheel on machines that carry it (find-links); elsewhere point
  # RVU_TORCH_INDEX at https://download.pytorch.org/whl/cpu to get the CPU build.
  extra=()
  [ -n "${RVU_TORCH_INDEX:-}" ] && extra=(--index-url "$RVU_TORCH_INDEX")
  echo "set-up: installing torch==$TORCH_VERSION (CPU build)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${extra[@]}" "torch==$TORCH_VERSION"
fi

# llama-cpp-python: our own build, never one uv compiled with -march=native (its cache key knows no CPU)
build_info="$VENV/rvu-llama-build.json"
wheel=$("$PYTHON" scripts/build_llama_cpp.py wheel)
if ! cmp -s "$(dirname "$wheel")/build-info.json" "$build_info"; then
  echo "set-up: installing $(basename "$wheel") (build $llama_build)"
  "$VENV/bin/uv" pip install --python "$VENV/bin/python" --reinstall-package llama-cpp-python --no-deps "$wheel"
  cp "$(dirname "$wheel")/build-info.json" "$build_info"
fi

echo "set-up: installing the project and its pinned dependencies"
"$VENV/bin/uv" pip install --python "$VENV/bin/python" -c requirements/constraints.txt -e '.[dev,docs]'
# byte-compile every installed module once, here: where PYTHONDONTWRITEBYTECODE is set (container images set
# it) nothing else writes .pyc files, and each new process (a test worker, a Dagster step, `rvu`) would compile
# every module it imports again, seconds per process
echo "set-up: byte-compiling the installed packages"
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null \
  || true  # a few packages ship sources for other Python versions (templates, test data): those stay uncompiled

echo "$inputs_hash" > "$STAMP"
smoke_generation
echo "set-up: done"
