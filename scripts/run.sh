#!/usr/bin/env bash
# Install (if needed) and run the main job on its built-in default: the tiny random Qwen-Image on
# CPU. Extra arguments go to the job. Until the distributed trainer lands this is the one-process
# Flow-GRPO sanity step (sample with log-probs, reward, replay, update); outputs under outputs/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m verl_omni.trainer.sanity_step "$@"
