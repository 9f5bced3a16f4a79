#!/usr/bin/env bash
# On the GPU machine, from the repository root, after every bundle part was carried: install the
# bundle (once per machine) and this checkout, and print the exports to eval:
#   eval "$(bash scripts/device/setup_stack.sh .gpu-bundle)"
# The checkout is installed without editable mode into a target directory, so that verl's and
# vLLM's plugin entry points find verl_omni in every process. Each call installs into a new directory: a run
# started by an earlier call (recipe_in_background.sh) keeps importing from its own, which a reinstall in place
# would empty under it (its Ray workers then found no model adapter).
set -euo pipefail
bundle=${1:?bundle dir}
last=$(ls -d "$bundle"/part-*.d | tail -n 1)
eval "$(bash "$last/unpack.sh" "$bundle")"
site=$(mktemp -d /tmp/site-verl-omni.XXXXXX)
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --target "$site" . >&2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >&2
PYTHONPATH=$site:$PYTHONPATH python3 -c "import torch, vllm, vllm_omni, diffusers, verl; print('torch', torch.__version__, 'vllm', vllm.__version__, 'vllm_omni', vllm_omni.__version__, 'diffusers', diffusers.__version__, 'verl', verl.__version__)" >&2
echo "export PYTHONPATH=$site:$PYTHONPATH"
# the bundle carries no flashinfer: vLLM's AR sampler (BAGEL's thinker stage) must use its own top-k/top-p
echo "export VLLM_USE_FLASHINFER_SAMPLER=0"
