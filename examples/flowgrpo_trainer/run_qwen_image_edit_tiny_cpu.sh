#!/usr/bin/env bash
# Flow-GRPO on the tiny random Qwen-Image-Edit, on the CPU: instruction + source image per prompt.
# The tiny model and the tiny editing set (solid-colour 32x32 source images, instructions in the tiny
# tokenizer's words) are built once under outputs/builtin/; 32x32 edits, the source image conditioned at
# 32x32 (condition_area=1024; the stock 1024x1024 is 16k latent tokens of the tiny VAE), 6 steps,
# 4 prompts x 4 samples per step, all 6 steps stochastic (noise 1.2), true CFG 4 with the negative prompt
# " ", LoRA r8, the toy brightness reward. Extra arguments are Hydra overrides. See docs/guide/models.md.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-outputs/builtin/tiny_qwen_image_edit}
DATA_DIR=${DATA_DIR:-outputs/builtin/tiny_edit_prompts}
OUT=${OUT:-outputs/flowgrpo/qwen_image_edit_tiny}

if [ ! -f "$MODEL_PATH/model_index.json" ]; then
    python3 -m verl_omni.utils.tiny_models qwen_image_edit --out "$MODEL_PATH"
fi
if [ ! -f "$DATA_DIR/train.parquet" ]; then
    python3 examples/data_process/edit_prompts.py --tiny --out "$DATA_DIR"
fi

python3 -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.lora.rank=8 \
    actor_rollout_ref.rollout.height=32 \
    actor_rollout_ref.rollout.width=32 \
    actor_rollout_ref.rollout.num_inference_steps=6 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.sde_window_size=6 \
    actor_rollout_ref.rollout.noise_level=1.2 \
    actor_rollout_ref.rollout.true_cfg_scale=4.0 \
    actor_rollout_ref.rollout.negative_prompt="' '" \
    +actor_rollout_ref.rollout.model_kwargs.condition_area=1024 \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=4 \
    'reward.diffusion.scorers=[{type: brightness}]' \
    trainer.device=cpu \
    trainer.n_gpus_per_node=1 \
    trainer.experiment_name=qwen_image_edit_tiny \
    trainer.default_local_dir="$OUT" \
    "$@"
