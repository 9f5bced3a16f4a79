#!/usr/bin/env bash
# Flow-GRPO on LTX-2 (text to video with its audio track) with a LoRA, OCR reward on every frame: the preset
# verl_omni/trainer/config/experiment/ltx2_ocr_lora.yaml (the release's one-stage sampling settings: 512x768, 24 fps,
# video CFG 3, audio CFG 7, the release's negative prompt; 49 frames and 20 steps for cost; each number's source
# beside it), with the paths below. The rollout and the replay denoise video and audio as one latent; the validation
# mp4s carry the sound. To reward the sound too, add an audio scorer, e.g.
#   '+reward.diffusion.scorers.1={type: clap, params: {model_path: /models/clap-htsat-unfused}}'
# Memory: not measured on a GPU (docs/guide/models.md, "Limits").
#
# Needs: a diffusers LTX-2 directory (MODEL_PATH, LTX2Pipeline layout, e.g. Lightricks/LTX-2), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM server for the OCR
# reward at OCR_URL serving OCR_MODEL. NGPUS (default 8), NNODES and OUT size and place the run.
# Extra arguments are Hydra overrides (last wins); `algorithm=<name>` brings another algorithm's keys.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers LTX-2 directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}

source "$(dirname "$0")/recipe.sh"
run_recipe ltx2_ocr_lora OCR "$@"
