#!/usr/bin/env bash
# Flow-GRPO on Wan2.2 T2V-A14B (two experts) text-to-video with a LoRA on both experts, OCR reward on every frame.
#
# A starting point, not a tuned recipe: the Flow-GRPO authors publish no Wan2.2 recipe, and nothing here
# has trained the released weights (the GPU machines cannot download them). Each number says where it
# comes from. How the two experts train (one LoRA over both, each recorded step replayed by the expert that
# sampled it, two diffusers LoRA files per checkpoint): docs/guide/models.md, "Video models (Wan2.2)". The reward is
# the OCR scorer applied to every frame, a video's reward the mean over its frames.
# Memory: each expert is a 14 B transformer (28 GB of bf16 weights), and the rollout keeps both resident, so a
# colocated replica needs ~56 GB for the experts alone before the actor's FSDP shards and activations: plan on
# 141 GB GPUs (H200) or a separate rollout pool. Not run end to end on a GPU; the actor's replay with both experts on
# one H100 fits 832x480x33 at micro-batch 1 (70.6 GiB before the optimizer state: benchmarks/results/models_gpu.md,
# "Wan2.2 T2V-A14B").
#
# Needs: a diffusers Wan2.2 T2V-A14B directory (MODEL_PATH, WanPipeline layout with transformer_2 and
# boundary_ratio in model_index.json, e.g. Wan-AI/Wan2.2-T2V-A14B-Diffusers), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM server for the
# OCR reward. Extra arguments are Hydra overrides (last wins). Advantage settings and the SDE step are the
# algorithm's (config/algorithm/<name>.yaml): not repeated here, so that `algorithm=<name>` brings another
# algorithm's keys.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Wan2.2 T2V-A14B directory}
export MODEL_PATH
export OUT=${OUT:-outputs/flowgrpo/wan2_2_a14b_ocr_lora}

# The 5B launcher's recipe (run_wan2_2_5b_ocr_lora.sh: 480x832, 33 frames, 20 steps, noise 0.7, SDE window 2 in the
# first half, group 8, LoRA 64/128 on both experts here, lr 3e-4, no KL, bf16), with the A14B's differences after
# it (Hydra overrides: last wins). 832x480 also fits the A14B's 16 pixels per patch (8x VAE x 2x2 patches). The 20
# steps are ours, for cost (the authors' T2V-A14B config samples 40, `sample_steps`). CFG 4.0 is the authors'
# high-noise scale (`sample_guide_scale = (3.0, 4.0)`, low / high noise); one scale serves both experts here (the
# rollout has one `true_cfg_scale`), so the low-noise expert samples at 4.0 instead of 3.0. The expert boundary is
# the checkpoint's `boundary_ratio` (the authors' 0.875): the SDE window may fall on either expert's steps, and the
# sync, replay and probe cover both.
exec bash "$(dirname "$0")/run_wan2_2_5b_ocr_lora.sh" \
    actor_rollout_ref.rollout.true_cfg_scale=4.0 \
    trainer.experiment_name=wan2_2_a14b_ocr_lora \
    "$@"
