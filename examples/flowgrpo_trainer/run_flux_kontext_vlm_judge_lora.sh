#!/usr/bin/env bash
# Flow-GRPO on FLUX.1-Kontext-dev with a LoRA: one source image and an instruction per prompt, graded by a VLM judge:
# the preset verl_omni/trainer/config/experiment/flux_kontext_vlm_judge_lora.yaml (the Flow-GRPO authors' FLUX.1-dev
# settings, each number sourced there, with the edit model's own conditioning) with the paths and the judge below.
#
# The reward is the vlm_judge scorer (docs/guide/rewards.md, "VLM judge"), served and configured as in
# run_qwen_image_edit_vlm_judge_lora.sh (the vllm serve command, each of its numbers and each reward key are
# explained there): one chat request per sample with the source image, the edited image and the instruction.
# Serve the judge on a GPU the trainer does not use (the launcher takes all 8 of its node by default: another
# machine's, with JUDGE_URL naming that machine), e.g.
#   vllm serve Qwen/Qwen2.5-VL-7B-Instruct --port 8000 --max-model-len 4096 \
#     --limit-mm-per-prompt '{"image": 2}' --mm-processor-kwargs '{"max_pixels": 1048576}'
# (max_pixels 1048576: the preset's condition_area). What differs from the Qwen-Image-Edit launcher is the load:
# a step judges 48 prompts x 24 samples = 1152 edits, so
#   reward.diffusion.scorers.0.params.max_concurrency=256: about what one 80 GB GPU holds at once: the 7B judge's
#     KV cache takes 57 KB a token (28 layers x 4 KV heads x 128 dims x key and value x 2 bytes), a request at
#     most ~3400 tokens (two images of at most 1337, template, 512 answer tokens), so at most ~195 MB a request,
#     against the ~55 GB left of 80 GB at vLLM's default 0.9 memory use after 16.6 GB of bf16 weights: ~280;
#   reward.diffusion.scorers.0.params.timeout_s=120: a request waits behind the others' prefill (256 x up to
#     ~2900 prompt tokens); docs/guide/rewards.md's example value, not measured here.
# The judge's speed sets the reward phase's time (not measured): more judge replicas behind one URL shorten it.
# FLUX.1-Kontext-dev is guidance-distilled like FLUX.1-dev: true_cfg_scale must stay 1 (the preflight refuses more).
#
# Needs: a diffusers FLUX.1-Kontext-dev directory (MODEL_PATH), an editing prompt set
# (python examples/data_process/edit_prompts.py --images <folder of images + .txt instructions> --out "$DATA_DIR")
# and the judge server above (JUDGE_URL, JUDGE_MODEL; the preflight checks that JUDGE_URL answers before Ray
# starts). NGPUS (default 8), NNODES and OUT size and place the run. Extra arguments are Hydra overrides (last wins);
# `algorithm=<name>` brings another algorithm's keys (docs/guide/algorithms.md, "Launchers"). See docs/guide/models.md.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers FLUX.1-Kontext-dev directory}
DATA_DIR=${DATA_DIR:-$HOME/data/edit}

source "$(dirname "$0")/recipe.sh"
run_recipe flux_kontext_vlm_judge_lora JUDGE \
    reward.diffusion.scorers.0.params.max_concurrency=256 \
    reward.diffusion.scorers.0.params.timeout_s=120 \
    "$@"
