#!/usr/bin/env bash
# Flow-GRPO on Qwen-Image with a LoRA, OCR reward (the known-good recipe): the preset
# verl_omni/trainer/config/experiment/qwen_image_ocr_lora.yaml (512x512, 10 steps, true CFG 4, SDE window of 2 steps
# in [0, 5], noise level 1.2, LoRA r64, 16 samples per prompt) with the paths below.
#
# Needs: a diffusers Qwen-Image directory (MODEL_PATH), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM
# server for the OCR reward (e.g. `vllm serve Qwen/Qwen2.5-VL-7B-Instruct --port 8000`) at OCR_URL serving OCR_MODEL.
# The rollout replicas sit on the actor's GPUs (trainer.colocate_rollout=true) and offload their weights while the
# actor trains: one 141 GB GPU (NGPUS=1, an H200) holds both. One 80 GB GPU (an H100) holds them only with the actor's
# parameters and optimizer on the host between phases, and the host then needs ~150 GB free (docs/perf.md):
#   bash examples/flowgrpo_trainer/run_qwen_image_ocr_lora.sh actor_rollout_ref.actor.engine.param_offload=true \
#       actor_rollout_ref.actor.engine.optimizer_offload=true
# More GPUs: NGPUS actor ranks and as many rollout replicas. Extra arguments are Hydra overrides. See docs/guide/training.md.
#
# Not on here (off by default until its reward effect is shown neutral, docs/guide/rollout.md "Thinning the ODE after the
# window range"): steps 5..9, after every sample's window, as 3 DPM-Solver++ steps (8 of 10 transformer calls per
# image; the window steps and their log-probs unchanged); to turn it on:
#   bash examples/flowgrpo_trainer/run_qwen_image_ocr_lora.sh actor_rollout_ref.rollout.ode_solver=dpmsolver++ \
#       actor_rollout_ref.rollout.ode_post_window_ratio=0.7
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-$HOME/models/Qwen-Image}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}

source "$(dirname "$0")/recipe.sh"
run_recipe qwen_image_ocr_lora OCR "$@"
