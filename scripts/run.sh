#!/usr/bin/env bash
# Install (if needed) and run the main job on its built-in default: Flow-GRPO training
# (python -m verl_omni.trainer.main_flowgrpo) of a LoRA on the tiny random Qwen-Image on CPU, with
# the built-in prompts and the toy brightness reward. Extra arguments are Hydra overrides.
# Outputs (metrics.jsonl, image grids, LoRA checkpoints) under outputs/flowgrpo/; see docs/guide/training.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m verl_omni.trainer.main_flowgrpo "$@"
