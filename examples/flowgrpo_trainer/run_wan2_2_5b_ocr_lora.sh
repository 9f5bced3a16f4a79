#!/usr/bin/env bash
# Flow-GRPO on Wan2.2 TI2V-5B text-to-video with a LoRA, OCR reward on every frame: the preset
# verl_omni/trainer/config/experiment/wan2_2_5b_ocr_lora.yaml (a starting point, not a tuned recipe; each number's
# source beside it), with the paths below.
# Memory (H100 80 GB, random weights, docs/perf.md "Wan2.2"): gradient checkpointing is on by default; the
# actor's replay at 832x480x33 fits at micro-batch 1 or 2, and the rollout decodes 2 videos per VAE call so a group
# of 8 fits. The colocated trainer itself was not run on a GPU.
#
# Needs: a diffusers Wan2.2 TI2V-5B directory (MODEL_PATH, WanPipeline layout, e.g. Wan-AI/Wan2.2-TI2V-5B-Diffusers),
# the OCR prompt set (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM
# server for the OCR reward at OCR_URL serving OCR_MODEL. NGPUS (default 8), NNODES and OUT size and place the run.
# Extra arguments are Hydra overrides (last wins); `algorithm=<name>` brings another algorithm's keys.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Wan2.2 TI2V-5B directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}

source "$(dirname "$0")/recipe.sh"
run_recipe wan2_2_5b_ocr_lora OCR "$@"
