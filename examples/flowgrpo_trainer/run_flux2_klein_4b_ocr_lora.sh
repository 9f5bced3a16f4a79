#!/usr/bin/env bash
# Flow-GRPO on the step-distilled FLUX.2-klein 4B with a LoRA, OCR reward: the preset
# verl_omni/trainer/config/experiment/flux2_klein_4b_ocr_lora.yaml (the model card's 4 steps without CFG; the
# Flow-GRPO authors' FLUX.1-dev batches, noise and LoRA; each number's source beside it), with the paths below. The
# step-distilled klein samples without CFG: true_cfg_scale must stay 1 (the preflight refuses more). MODEL_PATH at the
# base klein (FLUX.2-klein-base-4B) trains it with its CFG 4 instead (the preset's header says how to sample it with
# its 50 steps).
#
# Needs: a diffusers FLUX.2-klein directory (MODEL_PATH, Flux2KleinPipeline layout), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM server for the OCR
# reward at OCR_URL serving OCR_MODEL. NGPUS (default 8), NNODES and OUT size and place the run. Extra arguments are
# Hydra overrides (last wins); `algorithm=<name>` brings another algorithm's keys (docs/guide/algorithms.md, "Launchers").
# See docs/guide/models.md.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers FLUX.2-klein directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}

source "$(dirname "$0")/recipe.sh"
run_recipe flux2_klein_4b_ocr_lora OCR "$@"
