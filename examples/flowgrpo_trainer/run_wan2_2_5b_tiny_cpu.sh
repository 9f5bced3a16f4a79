#!/usr/bin/env bash
# Flow-GRPO on the tiny random Wan2.2 TI2V-5B (text-to-video) on CPU: the built-in run of
# run_tiny_cpu.sh with only the model and the frame count changed. 5 frames (two latent frames: the
# VAE compresses 4 frames after the first into one) of 32x32, 6 steps, 4 prompts x 4 samples per
# step, all 6 steps stochastic (noise 1.2), no CFG, LoRA r8; the toy brightness reward scores every
# frame and a video's reward is the mean over its frames (docs/guide/models.md, "Video models (Wan2.2)").
# Build the model first: python -m verl_omni.utils.tiny_models wan2_2 --out "$MODEL_PATH".
# Extra arguments are Hydra overrides (last wins). See docs/guide/training.md.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a tiny Wan2.2 directory (python -m verl_omni.utils.tiny_models wan2_2 --out DIR)}
OUT=${OUT:-outputs/flowgrpo/wan2_2_5b_tiny}

python3 -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.lora.rank=8 \
    actor_rollout_ref.rollout.height=32 \
    actor_rollout_ref.rollout.width=32 \
    actor_rollout_ref.rollout.num_frames=5 \
    actor_rollout_ref.rollout.num_inference_steps=6 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.sde_window_size=6 \
    actor_rollout_ref.rollout.noise_level=1.2 \
    actor_rollout_ref.rollout.true_cfg_scale=1.0 \
    data.train_files=builtin://tiny_prompts/train.parquet \
    data.val_files=builtin://tiny_prompts/val.parquet \
    data.train_batch_size=4 \
    'reward.diffusion.scorers=[{type: brightness}]' \
    trainer.device=cpu \
    trainer.n_gpus_per_node=1 \
    trainer.default_local_dir="$OUT" \
    "$@"
