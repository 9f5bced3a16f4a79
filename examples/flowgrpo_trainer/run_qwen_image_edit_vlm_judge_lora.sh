#!/usr/bin/env bash
# Flow-GRPO on Qwen-Image-Edit with a LoRA: one source image and an instruction per prompt, graded by a VLM judge.
#
# No authors' editing recipe is cited here: the sampling and optimizer settings are this project's
# Qwen-Image recipe (run_qwen_image_ocr_lora.sh, Flow-GRPO's Qwen-Image settings), with the edit
# model's own conditioning.
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
#   max_pixels 1048576: the source image's conditioning area (1024x1024, below), so Qwen2.5-VL spends at most
#     1048576 / 28^2 = 1337 tokens on an image (14-pixel patches merged 2x2); without it its processor allows
#     12845056 pixels (16384 tokens) per image and vLLM reserves that much;
#   --max-model-len 4096: two images of at most 1337 tokens, the template and instruction (~200 tokens) and the
#     answer (max_tokens 512) make at most ~3400.
# The reward keys: reward@reward.diffusion=vlm_judge takes the scorer's node (verl_omni/trainer/config/reward/
# vlm_judge.yaml, every key commented, each at its default), and the launcher sets
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
# What differs from Qwen-Image:
#   - the source image is conditioned at 1024x1024 pixels at its aspect ratio (vLLM-Omni's and diffusers'
#     default; +actor_rollout_ref.rollout.model_kwargs.condition_area=<pixels> sets it), encoded once per
#     prompt by the VAE (its latent tokens ride beside the noise tokens) and with the instruction by the
#     Qwen2.5-VL text encoder;
#   - the negative prompt is " " (the Qwen-Image-Edit authors' recommended whitespace);
#   - each request carries its source image, sent once for the group of n samples.
#
# Needs: a diffusers Qwen-Image-Edit directory (MODEL_PATH), an editing prompt set
# (python examples/data_process/edit_prompts.py --images <folder of images + .txt instructions> --out "$DATA_DIR")
# and the judge server above (JUDGE_URL, JUDGE_MODEL; the preflight checks that JUDGE_URL answers before Ray starts).
# Extra arguments are Hydra overrides (last wins).
# Advantage settings and the SDE step are the algorithm's (config/algorithm/<name>.yaml), so that
# `algorithm=<name>` (docs/guide/algorithms.md, "Launchers") brings another algorithm's keys.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Qwen-Image-Edit directory}
DATA_DIR=${DATA_DIR:-$HOME/data/edit}
JUDGE_URL=${JUDGE_URL:-http://127.0.0.1:8000/v1}
JUDGE_MODEL=${JUDGE_MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
NGPUS=${NGPUS:-1}
NNODES=${NNODES:-1}
OUT=${OUT:-outputs/flowgrpo/qwen_image_edit_vlm_judge_lora}

# The Qwen-Image recipe's values (run_qwen_image_ocr_lora.sh): 512x512, 10 steps, true CFG 4, SDE window of
# 2 steps in [0, 5], noise level 1.2, LoRA r64 / alpha 128, 16 samples per prompt, 4 prompts per step,
# mini-batch 32, micro-batch 8, lr 3e-4, weight decay 1e-4, clip 1e-4, KL 0.04, grad clip 1, seed 42, bf16;
# colocated rollout (one 141 GB GPU holds both for Qwen-Image; the edit model's text stream and image
# tokens are longer: measure before relying on NGPUS=1).
python3 -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.lora.rank=64 \
    actor_rollout_ref.model.lora.alpha=128 \
    actor_rollout_ref.rollout.height=512 \
    actor_rollout_ref.rollout.width=512 \
    actor_rollout_ref.rollout.num_inference_steps=10 \
    actor_rollout_ref.rollout.true_cfg_scale=4.0 \
    actor_rollout_ref.rollout.negative_prompt="' '" \
    actor_rollout_ref.rollout.noise_level=1.2 \
    actor_rollout_ref.rollout.sde_window_size=2 \
    actor_rollout_ref.rollout.sde_window_range=[0,5] \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.rollout.enable_batched_diffusion=True \
    actor_rollout_ref.rollout.dtype=bfloat16 \
    actor_rollout_ref.rollout.nnodes="$NNODES" \
    actor_rollout_ref.rollout.n_gpus_per_node="$NGPUS" \
    actor_rollout_ref.rollout.agent.num_workers=2 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.clip_ratio=1e-4 \
    actor_rollout_ref.actor.kl_beta=0.04 \
    actor_rollout_ref.actor.optim.lr=3e-4 \
    actor_rollout_ref.actor.optim.weight_decay=1e-4 \
    actor_rollout_ref.actor.optim.clip_grad=1.0 \
    actor_rollout_ref.actor.engine.seed=42 \
    actor_rollout_ref.actor.engine.model_dtype=bf16 \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=4 \
    data.val_batch_size=16 \
    reward@reward.diffusion=vlm_judge \
    reward.diffusion.scorers.0.params.url="$JUDGE_URL" \
    reward.diffusion.scorers.0.params.model="$JUDGE_MODEL" \
    reward.diffusion.scorers.0.params.max_concurrency=64 \
    reward.diffusion.num_workers=1 \
    trainer.device=cuda \
    trainer.nnodes="$NNODES" \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.colocate_rollout=true \
    trainer.experiment_name=qwen_image_edit_vlm_judge_lora \
    trainer.default_local_dir="$OUT" \
    trainer.logger='["console","file","tensorboard"]' \
    trainer.total_training_steps=300 \
    trainer.save_freq=25 \
    trainer.test_freq=25 \
    trainer.val_grid_images=16 \
    "$@"
