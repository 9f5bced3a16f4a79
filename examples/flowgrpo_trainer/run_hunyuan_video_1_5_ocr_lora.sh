#!/usr/bin/env bash
# Flow-GRPO on HunyuanVideo-1.5 (480p text-to-video) with a LoRA, OCR reward on every frame: the preset
# verl_omni/trainer/config/experiment/hunyuan_video_1_5_ocr_lora.yaml (the released pipeline's sampling settings, each
# cited there: 480x848, 121 frames, 50 steps, CFG 6, the checkpoint's flow shift) with the paths below. How the model
# trains (its two prompt encoders, the LoRA on the dual-stream blocks, not on the token refiner): docs/guide/models.md,
# "Video models (HunyuanVideo-1.5)".
# Memory and cost: an 8.3 B transformer; 121 frames at 480x848 are 31 latent frames of 30x53 cells (about 49k video
# tokens per sample), so each step of the actor's replay is long: fewer frames or steps
# (actor_rollout_ref.rollout.num_frames, num_inference_steps) are the first levers. Not run end to end on a GPU.
#
# Needs: a diffusers HunyuanVideo-1.5 text-to-video directory (MODEL_PATH, HunyuanVideo15Pipeline layout, e.g.
# hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v), the OCR prompt set (python examples/data_process/ocr_prompts.py
# --out "$DATA_DIR") and an OpenAI-compatible VLM server for the OCR reward at OCR_URL serving OCR_MODEL. NGPUS
# (default 8), NNODES and OUT size and place the run. Extra arguments are Hydra overrides (last wins);
# `algorithm=<name>` brings another algorithm's keys (docs/guide/algorithms.md).
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers HunyuanVideo-1.5 text-to-video directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}

source "$(dirname "$0")/recipe.sh"
run_recipe hunyuan_video_1_5_ocr_lora OCR "$@"
