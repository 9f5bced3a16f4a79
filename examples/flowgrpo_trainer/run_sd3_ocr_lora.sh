#!/usr/bin/env bash
# Flow-GRPO on Stable Diffusion 3.5 Medium with a LoRA, OCR reward: the Flow-GRPO paper's recipe for it, the preset
# verl_omni/trainer/config/experiment/sd3_ocr_lora.yaml (each number's source beside it, where this trainer differs,
# the authors' 1-GPU variant), with the paths below.
#
# Needs: a diffusers SD3.5 directory (MODEL_PATH, e.g. stabilityai/stable-diffusion-3.5-medium), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM server for the OCR
# reward at OCR_URL serving OCR_MODEL. NGPUS (default 8), NNODES and OUT size and place the run. Extra arguments are
# Hydra overrides (last wins); `algorithm=<name>` brings another algorithm's keys (docs/guide/algorithms.md, "Launchers").
# See docs/guide/models.md and docs/guide/training.md.
#
# Not on here (the preset serves every algorithm, and those whose loss reads no log-probs refuse these keys): with
# flow_grpo, mix_grpo or dance_grpo, the rollout's log-probs as pi_old skip one forward pass of the batch per step
# (docs/guide/training.md, "The rollout's log-probs as the old policy"):
#   bash examples/flowgrpo_trainer/run_sd3_ocr_lora.sh actor_rollout_ref.actor.use_rollout_log_probs=true \
#       actor_rollout_ref.actor.rollout_correction.loss_type=reinforce actor_rollout_ref.actor.rollout_log_prob_check_freq=10
# Full fine-tuning: actor_rollout_ref.model.lora.rank=0 actor_rollout_ref.model.lora.merge=false.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Stable Diffusion 3.5 directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}

source "$(dirname "$0")/recipe.sh"
run_recipe sd3_ocr_lora OCR "$@"
