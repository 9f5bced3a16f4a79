#!/usr/bin/env bash
# Flow-GRPO LoRA training of BAGEL (thinker + DiT) on OCR prompts, vLLM-Omni rollout: the preset
# verl_omni/trainer/config/experiment/bagel_ocr_lora.yaml with the paths below; see docs/guide/models.md ("Training run").
#   BAGEL_PATH=/models/BAGEL-7B-MoT DATA_DIR=~/data/ocr bash examples/flowgrpo_trainer/run_bagel_ocr_lora.sh [overrides...]
# The prompt set: python examples/data_process/ocr_prompts.py --out "$DATA_DIR"; the OCR reward: an
# OpenAI-compatible VLM server at OCR_URL serving OCR_MODEL (as the other OCR launchers). NGPUS (default 8) actor GPUs.
# DEPLOY selects vLLM-Omni's BAGEL topology: bagel (thinker + DiT, default) or bagel_single_stage (DiT only).
set -euo pipefail

BAGEL_PATH=${BAGEL_PATH:?set BAGEL_PATH to a BAGEL checkpoint directory (ByteDance-Seed/BAGEL-7B-MoT layout)}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}
DEPLOY_CONFIG=$(python3 -c "from verl_omni.pipelines.bagel import vllm_omni_deploy_config as p; print(p('${DEPLOY:-bagel}'))")

source "$(dirname "$0")/recipe.sh"
MODEL_PATH=$BAGEL_PATH run_recipe bagel_ocr_lora OCR \
    +actor_rollout_ref.rollout.engine_kwargs.vllm_omni.deploy_config="$DEPLOY_CONFIG" \
    "$@"
