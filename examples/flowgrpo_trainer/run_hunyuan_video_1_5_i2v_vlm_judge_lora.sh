#!/usr/bin/env bash
# Flow-GRPO on HunyuanVideo-1.5 (480p image-to-video) with a LoRA: one source image (the video's first frame) and a
# prompt per row, graded by a VLM judge: the preset
# verl_omni/trainer/config/experiment/hunyuan_video_1_5_i2v_vlm_judge_lora.yaml (the released pipelines' sampling
# settings, each cited there: 480x832, 121 frames, 50 steps, CFG 6, the checkpoint's flow shift) with the paths and
# the judge below. How the source image conditions (its first-frame latents and SigLIP states, recorded once per
# request): docs/guide/models.md, "Video models (HunyuanVideo-1.5)".
#
# The reward is the vlm_judge scorer (docs/guide/rewards.md, "VLM judge"), served as in
# run_qwen_image_edit_vlm_judge_lora.sh, on video frames 0, 30, 60, 90 and 120
# (reward.diffusion.scorers.0.frame_stride=30: five chat requests per video, each with the source image and one frame;
# the sample's reward is their mean). Memory and cost: as run_hunyuan_video_1_5_ocr_lora.sh's comment (an 8.3 B
# transformer, about 48k video tokens per sample at 121 frames); fewer frames or steps are the first levers. Not run
# end to end on a GPU.
#
# Needs: a diffusers HunyuanVideo-1.5 image-to-video directory (MODEL_PATH, HunyuanVideo15ImageToVideoPipeline layout,
# e.g. hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v), a prompt set with one source image per row (python
# examples/data_process/edit_prompts.py --images <folder of images + .txt prompts> --out "$DATA_DIR"; the image is
# resized to the video's size) and the judge server (JUDGE_URL, JUDGE_MODEL; the preflight checks that JUDGE_URL
# answers before Ray starts). NGPUS (default 8), NNODES and OUT size and place the run. Extra arguments are Hydra
# overrides (last wins); `algorithm=<name>` brings another algorithm's keys (docs/guide/algorithms.md).
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers HunyuanVideo-1.5 image-to-video directory}
DATA_DIR=${DATA_DIR:-$HOME/data/i2v}

source "$(dirname "$0")/recipe.sh"
run_recipe hunyuan_video_1_5_i2v_vlm_judge_lora JUDGE reward.diffusion.scorers.0.frame_stride=30 "$@"
