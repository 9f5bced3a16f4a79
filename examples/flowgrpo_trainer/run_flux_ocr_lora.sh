#!/usr/bin/env bash
# Flow-GRPO on FLUX.1-dev with a LoRA, OCR reward, with the Flow-GRPO authors' FLUX.1-dev settings.
#
# The numbers are the authors' (github.com/yifan123/flow_grpo at 54809b5, config/grpo.py
# `pickscore_flux`, its defaults in config/base.py, and scripts/train_flux.py); each line says which.
# Their run: 32 GPUs, 48 prompts x 24 images per epoch, two optimizer updates per epoch, PickScore
# reward (no PickScore scorer here yet: this launcher uses the OCR reward of the other launchers).
# Where this trainer differs:
#   - validation samples with the training steps (6): the authors evaluate with 28
#     (`sample.eval_num_steps = 28`), which has no key here;
#   - their SDE runs on all 6 steps and the loss on the first 5 (`train.timestep_fraction = 0.99`:
#     int(6 * 0.99) = 5); here the window is those 5 steps and step 6 is the exact ODE step;
#   - their LoRA also adapts the feed-forward layers (train_flux.py target_modules `ff.net.0.proj`,
#     `ff.net.2`, `ff_context.*`); here the adapter's default, the attention projections, because
#     the rollout's binding of feed-forward LoRA names is not verified for FLUX yet
#     (actor_rollout_ref.model.lora.target_modules=[...] sets others); no EMA (`train.ema = True`).
# FLUX.1-dev is guidance-distilled: guidance_scale feeds its guidance embedding (one pass per step);
# true_cfg_scale must stay 1 (the preflight refuses more).
#
# Needs: a diffusers FLUX.1-dev directory (MODEL_PATH), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM
# server for the OCR reward. Extra arguments are Hydra overrides (last wins). See docs/guide/models.md.
# Advantage settings and the SDE step are the algorithm's (config/algorithm/<name>.yaml; flow_grpo's defaults,
# global std, clip 5 and the `sde` step, are the ones above):
# not repeated here, so that `algorithm=<name>` (docs/guide/algorithms.md, "Launchers") brings another algorithm's keys.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers FLUX.1-dev directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}
OCR_URL=${OCR_URL:-http://127.0.0.1:8000/v1}
OCR_MODEL=${OCR_MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
NGPUS=${NGPUS:-8}
NNODES=${NNODES:-1}
OUT=${OUT:-outputs/flowgrpo/flux_ocr_lora}

# resolution 512 (grpo.py `config.resolution = 512`); 6 sampling steps (`sample.num_steps = 6`);
# embedded guidance 3.5 (`sample.guidance_scale = 3.5`); noise level 0.9 (`sample.noise_level = 0.9`),
# the `sde` step; SDE window: the first 5 of 6 steps (`train.timestep_fraction = 0.99`); group size 24
# (`sample.num_image_per_prompt = 24`); 48 prompts per step (`48` in `num_batches_per_epoch`); two
# updates per step (gradient_accumulation_steps = num_batches_per_epoch // 2): mini-batch
# 48 * 24 / 2 = 576 samples; micro-batch 3 per GPU (`sample.train_batch_size = 3`, = train.batch_size);
# lr 3e-4, Adam weight decay 1e-4, grad-norm clip 1.0, PPO clip range 1e-4, advantages clipped to 5
# (base.py `train.learning_rate`, `train.adam_weight_decay`, `train.max_grad_norm`, `train.clip_range`,
# `train.adv_clip_max`); no KL (grpo.py `train.beta = 0`); std over the whole batch
# (`sample.global_std = True`); bf16 (`config.mixed_precision = "bf16"`); LoRA rank 64, alpha 128
# (train_flux.py `LoraConfig(r=64, lora_alpha=128)`); seed 42 (base.py `config.seed`);
# checkpoint and validation every 30 steps (`save_freq = 30`, `eval_freq = 30`); validation batch 16
# (`sample.test_batch_size = 16`).
python3 -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.lora.rank=64 \
    actor_rollout_ref.model.lora.alpha=128 \
    actor_rollout_ref.rollout.height=512 \
    actor_rollout_ref.rollout.width=512 \
    actor_rollout_ref.rollout.num_inference_steps=6 \
    actor_rollout_ref.rollout.true_cfg_scale=1.0 \
    actor_rollout_ref.rollout.guidance_scale=3.5 \
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
    'reward.diffusion.scorers=[{type: ocr, weight: 1.0, params: {url: '"$OCR_URL"', model: '"$OCR_MODEL"'}}]' \
    trainer.device=cuda \
    trainer.nnodes="$NNODES" \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.colocate_rollout=true \
    trainer.experiment_name=flux_ocr_lora \
    trainer.default_local_dir="$OUT" \
    trainer.logger='["console","file","tensorboard"]' \
    trainer.save_freq=30 \
    trainer.test_freq=30 \
    "$@"
