#!/usr/bin/env bash
# Flow-GRPO on FLUX.1-Kontext-dev with a LoRA: one source image and an instruction per prompt, graded by a VLM judge.
#
# No authors' editing recipe is cited here: the sampling and optimizer settings are the Flow-GRPO authors'
# FLUX.1-dev ones (run_flux_ocr_lora.sh, each number sourced there), with the edit model's own conditioning.
#
# The reward is the vlm_judge scorer (docs/guide/rewards.md, "VLM judge"), served and configured as in
# run_qwen_image_edit_vlm_judge_lora.sh (the vllm serve command, each of its numbers and each reward key are
# explained there): one chat request per sample with the source image, the edited image and the instruction.
# Serve the judge on a GPU the trainer does not use (the launcher takes all 8 of its node by default: another
# machine's, with JUDGE_URL naming that machine), e.g.
#   vllm serve Qwen/Qwen2.5-VL-7B-Instruct --port 8000 --max-model-len 4096 \
#     --limit-mm-per-prompt '{"image": 2}' --mm-processor-kwargs '{"max_pixels": 1048576}'
# (max_pixels 1048576: the condition_area below). What differs from the Qwen-Image-Edit launcher is the load:
# a step judges 48 prompts x 24 samples = 1152 edits, so
#   reward.diffusion.scorers.0.params.max_concurrency=256: about what one 80 GB GPU holds at once: the 7B judge's
#     KV cache takes 57 KB a token (28 layers x 4 KV heads x 128 dims x key and value x 2 bytes), a request at
#     most ~3400 tokens (two images of at most 1337, template, 512 answer tokens), so at most ~195 MB a request,
#     against the ~55 GB left of 80 GB at vLLM's default 0.9 memory use after 16.6 GB of bf16 weights: ~280;
#   reward.diffusion.scorers.0.params.timeout_s=120: a request waits behind the others' prefill (256 x up to
#     ~2900 prompt tokens); docs/guide/rewards.md's example value, not measured here.
# The judge's speed sets the reward phase's time (not measured): more judge replicas behind one URL shorten it.
# What differs from FLUX.1-dev:
#   - the embedded guidance is 2.5 (diffusers' FluxKontextPipeline example; the pipeline's default is 3.5);
#   - the source image is conditioned at 1024x1024 pixels at its aspect ratio (the area of diffusers'
#     preferred Kontext resolutions; without the setting the rollout keeps the image's own size, as
#     vLLM-Omni's Kontext pipeline does), encoded once per prompt by the VAE: its latent tokens ride after
#     the noise tokens (4096 of them beside the 1024 of a 512x512 edit: lower condition_area to save memory);
#   - each request carries its source image, sent once for the group of n samples.
# FLUX.1-Kontext-dev is guidance-distilled like FLUX.1-dev: true_cfg_scale must stay 1 (the preflight refuses more).
#
# Needs: a diffusers FLUX.1-Kontext-dev directory (MODEL_PATH), an editing prompt set
# (python examples/data_process/edit_prompts.py --images <folder of images + .txt instructions> --out "$DATA_DIR")
# and the judge server above (JUDGE_URL, JUDGE_MODEL; the preflight checks that JUDGE_URL answers before Ray
# starts). Extra arguments are Hydra overrides (last wins). See docs/guide/models.md.
# Advantage settings and the SDE step are the algorithm's (config/algorithm/<name>.yaml), so that
# `algorithm=<name>` (docs/guide/algorithms.md, "Launchers") brings another algorithm's keys.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers FLUX.1-Kontext-dev directory}
DATA_DIR=${DATA_DIR:-$HOME/data/edit}
JUDGE_URL=${JUDGE_URL:-http://127.0.0.1:8000/v1}
JUDGE_MODEL=${JUDGE_MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
NGPUS=${NGPUS:-8}
NNODES=${NNODES:-1}
OUT=${OUT:-outputs/flowgrpo/flux_kontext_vlm_judge_lora}

# The FLUX.1-dev recipe's values (run_flux_ocr_lora.sh): 512x512, 6 steps, noise level 0.9, SDE window the
# first 5 of 6 steps, 24 samples per prompt, 48 prompts per step, mini-batch 576, micro-batch 3, lr 3e-4,
# weight decay 1e-4, grad clip 1, clip 1e-4, no KL, LoRA r64 / alpha 128, seed 42, bf16.
python3 -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.lora.rank=64 \
    actor_rollout_ref.model.lora.alpha=128 \
    actor_rollout_ref.rollout.height=512 \
    actor_rollout_ref.rollout.width=512 \
    actor_rollout_ref.rollout.num_inference_steps=6 \
    actor_rollout_ref.rollout.true_cfg_scale=1.0 \
    actor_rollout_ref.rollout.guidance_scale=2.5 \
    +actor_rollout_ref.rollout.model_kwargs.condition_area=1048576 \
    actor_rollout_ref.rollout.noise_level=0.9 \
    actor_rollout_ref.rollout.sde_window_size=5 \
    actor_rollout_ref.rollout.sde_window_range='[0,5]' \
    actor_rollout_ref.rollout.n=24 \
    actor_rollout_ref.rollout.enable_batched_diffusion=True \
    actor_rollout_ref.rollout.dtype=bfloat16 \
    actor_rollout_ref.rollout.nnodes="$NNODES" \
    actor_rollout_ref.rollout.n_gpus_per_node="$NGPUS" \
    actor_rollout_ref.actor.ppo_mini_batch_size=576 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3 \
    actor_rollout_ref.actor.clip_ratio=1e-4 \
    actor_rollout_ref.actor.kl_beta=0.0 \
    actor_rollout_ref.actor.optim.lr=3e-4 \
    actor_rollout_ref.actor.optim.weight_decay=1e-4 \
    actor_rollout_ref.actor.optim.clip_grad=1.0 \
    actor_rollout_ref.actor.engine.seed=42 \
    actor_rollout_ref.actor.engine.model_dtype=bf16 \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=48 \
    data.val_batch_size=16 \
    reward@reward.diffusion=vlm_judge \
    reward.diffusion.scorers.0.params.url="$JUDGE_URL" \
    reward.diffusion.scorers.0.params.model="$JUDGE_MODEL" \
    reward.diffusion.scorers.0.params.max_concurrency=256 \
    reward.diffusion.scorers.0.params.timeout_s=120 \
    reward.diffusion.num_workers=1 \
    trainer.device=cuda \
    trainer.nnodes="$NNODES" \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.colocate_rollout=true \
    trainer.experiment_name=flux_kontext_vlm_judge_lora \
    trainer.default_local_dir="$OUT" \
    trainer.logger='["console","file","tensorboard"]' \
    trainer.save_freq=30 \
    trainer.test_freq=30 \
    "$@"
