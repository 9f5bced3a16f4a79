#!/usr/bin/env bash
# On the GPU machine, from the repository root, after every bundle part was carried:
# install the bundle, make verl_omni importable (its entry points included) and run `pytest -m gpu`.
# Usage: bash scripts/device/run_gpu_tests.sh BUNDLE_DIR [pytest args]; logs to $OUT when set.
set -euo pipefail
bundle=${1:?bundle dir}; shift
last=$(ls -d "$bundle"/part-*.d | tail -n 1)
eval "$(bash "$last/unpack.sh" "$bundle")"
# an editable-free install of this checkout, so that verl's and vLLM's entry points find verl_omni
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --target /tmp/site-verl-omni . >&2
export PYTHONPATH=/tmp/site-verl-omni:$PYTHONPATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >&2
python3 -c "import torch, vllm, vllm_omni, diffusers, verl; print('torch', torch.__version__, 'vllm', vllm.__version__, 'vllm_omni', vllm_omni.__version__, 'diffusers', diffusers.__version__, 'verl', verl.__version__)"
log=${OUT:-/tmp}/gpu_tests.log
set -o pipefail
python3 -m pytest tests -m gpu -p no:cacheprovider -v "$@" 2>&1 | tee "$log"
