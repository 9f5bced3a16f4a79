#!/usr/bin/env bash
# Flow-GRPO on Z-Image with a LoRA, OCR reward: the preset verl_omni/trainer/config/experiment/z_image_ocr_lora.yaml
# (the Flow-GRPO authors' recipe for the nearest model, Qwen-Image; not tuned for Z-Image: a starting point), with
# the paths below.
#
# Needs: a diffusers Z-Image directory (MODEL_PATH, ZImagePipeline layout), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM server for the OCR
# reward at OCR_URL serving OCR_MODEL. NGPUS (default 8), NNODES and OUT size and place the run. Extra arguments are
# Hydra overrides (last wins); `algorithm=<name>` brings another algorithm's keys (docs/guide/algorithms.md, "Launchers").
# See docs/guide/models.md.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Z-Image directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}

source "$(dirname "$0")/recipe.sh"
run_recipe z_image_ocr_lora OCR "$@"
