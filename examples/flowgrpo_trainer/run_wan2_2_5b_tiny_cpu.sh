#!/usr/bin/env bash
# Flow-GRPO on the tiny random Wan2.2 TI2V-5B (text-to-video) on the CPU: the built-in run with only the model and the
# frame count changed (verl_omni/trainer/config/experiment/wan2_2_5b_tiny_cpu.yaml).
# Build the model first: python -m verl_omni.utils.tiny_models wan2_2 --out "$MODEL_PATH".
# Extra arguments are Hydra overrides (last wins). See docs/guide/training.md.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a tiny Wan2.2 directory (python -m verl_omni.utils.tiny_models wan2_2 --out DIR)}
OUT=${OUT:-outputs/flowgrpo/wan2_2_5b_tiny}

python3 -m verl_omni.trainer.main_flowgrpo +experiment=wan2_2_5b_tiny_cpu \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    trainer.default_local_dir="$OUT" \
    "$@"
