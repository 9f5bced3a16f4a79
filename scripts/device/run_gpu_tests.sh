#!/usr/bin/env bash
# On the GPU machine, from the repository root, after every bundle part was carried:
# install the stack and this checkout (setup_stack.sh) and run `pytest -m gpu`.
# Usage: bash scripts/device/run_gpu_tests.sh BUNDLE_DIR [pytest args]; logs to $OUT when set.
set -euo pipefail
bundle=${1:?bundle dir}; shift
eval "$(bash "$(dirname "$0")/setup_stack.sh" "$bundle")"
log=${OUT:-/tmp}/gpu_tests.log
python3 -m pytest tests -m gpu -p no:cacheprovider -v "$@" 2>&1 | tee "$log"
