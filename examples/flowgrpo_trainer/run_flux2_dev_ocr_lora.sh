#!/usr/bin/env bash
# Flow-GRPO on FLUX.2-dev with a LoRA, OCR reward: the preset
# verl_omni/trainer/config/experiment/flux2_dev_ocr_lora.yaml (the model card's 50 steps with embedded guidance 4;
# the Flow-GRPO authors' FLUX.1-dev batches, noise, SDE window and LoRA; each number's source beside it), with the
# paths below. FLUX.2-dev is guidance-distilled: true_cfg_scale must stay 1 (the preflight refuses more).
#
# Needs: a diffusers FLUX.2-dev directory (MODEL_PATH, Flux2Pipeline layout), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM server for the OCR
# reward at OCR_URL serving OCR_MODEL. NGPUS (default 8), NNODES and OUT size and place the run. Extra arguments are
# Hydra overrides (last wins); `algorithm=<name>` brings another algorithm's keys (docs/guide/algorithms.md, "Launchers").
# See docs/guide/models.md.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers FLUX.2-dev directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}

source "$(dirname "$0")/recipe.sh"
run_recipe flux2_dev_ocr_lora OCR "$@"
