#!/usr/bin/env bash
# The built-in CPU run, spelled out: the tiny random Qwen-Image (built once under outputs/builtin/),
# the built-in prompts and the toy brightness reward; 32x32, 6 steps, 4 prompts x 4 samples per
# step, all 6 steps stochastic (noise 1.2), no CFG, LoRA r8. These are the defaults of flowgrpo_trainer.yaml: with no arguments this is what
# `bash scripts/run.sh` runs. Extra arguments are Hydra overrides. See docs/guide/training.md.
set -euo pipefail

OUT=${OUT:-outputs/flowgrpo/flowgrpo_tiny}

python3 -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path=builtin://tiny_qwen_image \
    actor_rollout_ref.model.lora.rank=8 \
    actor_rollout_ref.rollout.height=32 \
    actor_rollout_ref.rollout.width=32 \
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
