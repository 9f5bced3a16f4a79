#!/usr/bin/env bash
# Flow-GRPO on Qwen-Image-Edit with a LoRA: one source image and an instruction per prompt, graded by a VLM judge: the
# preset verl_omni/trainer/config/experiment/qwen_image_edit_vlm_judge_lora.yaml (the Qwen-Image recipe's sampling and
# optimizer settings with the edit model's own conditioning) with the paths and the judge below.
#
# The reward is the vlm_judge scorer (docs/guide/rewards.md, "VLM judge"): one chat request per sample to an
# OpenAI-compatible server with the source image, the edited image and the instruction; the judge's grade,
# mapped to [0, 1], is the reward. Serve the judge on a GPU the trainer does not use, e.g.
#   CUDA_VISIBLE_DEVICES=1 vllm serve Qwen/Qwen2.5-VL-7B-Instruct --port 8000 --max-model-len 4096 \
#     --limit-mm-per-prompt '{"image": 2}' --mm-processor-kwargs '{"max_pixels": 1048576}'
# where
#   Qwen2.5-VL-7B-Instruct: the VLM the OCR launchers serve and docs/guide/rewards.md's judge example (an
#     instruction-following VLM that answers the default template; a larger one judges better at more GPUs);
#   --port 8000: vLLM's default port, the one JUDGE_URL below points at;
#   image 2: a request carries the source image and the edit;
#   max_pixels 1048576: the source image's conditioning area (1024x1024, the preset says), so Qwen2.5-VL spends at most
#     1048576 / 28^2 = 1337 tokens on an image (14-pixel patches merged 2x2); without it its processor allows
#     12845056 pixels (16384 tokens) per image and vLLM reserves that much;
#   --max-model-len 4096: two images of at most 1337 tokens, the template and instruction (~200 tokens) and the
#     answer (max_tokens 512) make at most ~3400.
# The reward keys: the preset takes the scorer's node (verl_omni/trainer/config/reward/vlm_judge.yaml, every key
# commented, each at its default), and the launcher sets
#   reward.diffusion.scorers.0.params.url              JUDGE_URL, the server's API base (requests go to <url>/chat/completions)
#   reward.diffusion.scorers.0.params.model            JUDGE_MODEL, the name vllm serve was given
#   reward.diffusion.scorers.0.params.max_concurrency  64: a step's 4 prompts x 16 samples in flight at once (vLLM 0.26's
#                                                      server batches up to 1024 sequences on an H100 / H200)
# and keeps at their defaults
#   reward.diffusion.scorers.0.params.prompt_template  the last image is graded, the ones before it are its sources;
#                                                      instruction following, keeping the rest, naturalness; "Score: N", N in 0..10
#   reward.diffusion.scorers.0.params.parser           regex: the last "Score: N" of the answer (score_pattern), in
#                                                      [score_min, score_max] = [0, 10], mapped to [0, 1] (normalize)
# (a judge with its own answer format, e.g. JSON scores: set prompt_template, parser=json and json_field).
#
# Needs: a diffusers Qwen-Image-Edit directory (MODEL_PATH), an editing prompt set
# (python examples/data_process/edit_prompts.py --images <folder of images + .txt instructions> --out "$DATA_DIR")
# and the judge server above (JUDGE_URL, JUDGE_MODEL; the preflight checks that JUDGE_URL answers before Ray starts).
# NGPUS (default 1), NNODES and OUT size and place the run. Extra arguments are Hydra overrides (last wins);
# `algorithm=<name>` brings another algorithm's keys (docs/guide/algorithms.md, "Launchers").
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Qwen-Image-Edit directory}
DATA_DIR=${DATA_DIR:-$HOME/data/edit}

source "$(dirname "$0")/recipe.sh"
run_recipe qwen_image_edit_vlm_judge_lora JUDGE \
    reward.diffusion.scorers.0.params.max_concurrency=64 \
    "$@"
