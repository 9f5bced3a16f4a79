#!/usr/bin/env bash
# Flow-GRPO on Wan2.2 I2V-A14B (two experts) image-to-video with a LoRA on both experts: one source image (the video's
# first frame) and a prompt per row, graded by a VLM judge: the preset
# verl_omni/trainer/config/experiment/wan2_2_i2v_a14b_vlm_judge_lora.yaml (the authors' released I2V-A14B sampling
# settings, each cited there: 480x832, 81 frames, 40 steps, CFG 3.5 for both experts, boundary 0.9 from the
# checkpoint) with the paths and the judge below. How the two experts and the source image train (one LoRA over both,
# each recorded step replayed by the expert that sampled it, the first-frame condition recorded once per request):
# docs/guide/models.md, "Video models (Wan2.2)".
#
# The reward is the vlm_judge scorer (docs/guide/rewards.md, "VLM judge"), served as in
# run_qwen_image_edit_vlm_judge_lora.sh (the vllm serve command and each reward key are explained there), on video
# frames 0, 20, 40, 60 and 80 (reward.diffusion.scorers.0.frame_stride=20: five chat requests per video, each with the
# source image and one frame; the sample's reward is their mean). The judge's default template grades an edit: set
# reward.diffusion.scorers.0.params.prompt_template to a frame-of-a-video wording if the judge reads it better.
# Memory: each expert is a 14 B transformer (28 GB of bf16 weights) and the rollout keeps both resident, so a colocated
# replica needs ~56 GB for the experts alone before the actor's shards and an 81-frame video's activations: plan on
# 141 GB GPUs (H200) or a separate rollout pool. Cost: 40 steps of 81 frames per sample; fewer steps or frames
# (actor_rollout_ref.rollout.num_inference_steps, num_frames) are the first levers. Not run end to end on a GPU.
#
# Needs: a diffusers Wan2.2 I2V-A14B directory (MODEL_PATH, WanImageToVideoPipeline layout with transformer_2 and
# boundary_ratio in model_index.json, e.g. Wan-AI/Wan2.2-I2V-A14B-Diffusers), a prompt set with one source image per
# row (python examples/data_process/edit_prompts.py --images <folder of images + .txt prompts> --out "$DATA_DIR"; the
# image is resized to the video's size) and the judge server (JUDGE_URL, JUDGE_MODEL; the preflight checks that
# JUDGE_URL answers before Ray starts). NGPUS (default 8), NNODES and OUT size and place the run. Extra arguments are
# Hydra overrides (last wins); `algorithm=<name>` brings another algorithm's keys (docs/guide/algorithms.md).
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Wan2.2 I2V-A14B directory}
DATA_DIR=${DATA_DIR:-$HOME/data/i2v}

source "$(dirname "$0")/recipe.sh"
run_recipe wan2_2_i2v_a14b_vlm_judge_lora JUDGE reward.diffusion.scorers.0.frame_stride=20 "$@"
