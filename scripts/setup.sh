#!/usr/bin/env bash
# Idempotent set-up of the project's virtual environment (.venv).
#
# Order matters: torch goes in first as the pinned CPU build, so nothing that depends on it can pull
# a multi-GB CUDA build; then uv installs the project (editable) under requirements/constraints.txt.
# llama-cpp-python compiles from source once (~11 min on 2 cores); uv caches the wheel, so later
# set-ups take seconds. A stamp of the inputs makes a second run skip finished work.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${RVU_VENV:-.venv}
PYTHON=${RVU_PYTHON:-$(command -v python3.11 || command -v python3)}
TORCH_VERSION=2.13.0
UV_VERSION=0.13.8
STAMP="$VENV/.rvu-setup-stamp"
inputs_hash=$(cat pyproject.toml requirements/constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)

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

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$inputs_hash" ] && [ -x "$VENV/bin/rvu" ]; then
  echo "set-up: $VENV is up to date (delete $STAMP to force a reinstall)"
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

echo "set-up: installing the project and its pinned dependencies (first run compiles llama-cpp-python, ~11 min)"
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  "$VENV/bin/uv" pip install --python "$VENV/bin/python" -c requirements/constraints.txt -e '.[dev]'

echo "$inputs_hash" > "$STAMP"
echo "set-up: done"
