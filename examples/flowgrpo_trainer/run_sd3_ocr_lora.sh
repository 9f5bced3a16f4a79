#!/usr/bin/env bash
# Flow-GRPO on Stable Diffusion 3.5 Medium with a LoRA, OCR reward: the Flow-GRPO paper's recipe for it.
#
# Every number below is the authors' (github.com/yifan123/flow_grpo at ac4c86e, config/grpo.py
# `general_ocr_sd3`, its defaults in config/base.py, and scripts/train_sd3.py); each line says which.
# Their run: 32 GPUs, 48 prompts x 24 images per epoch, two optimizer updates per epoch.
# Where this trainer differs:
#   - validation samples with the training steps (10): the authors evaluate with 40
#     (`sample.eval_num_steps = 40`), which has no key here;
#   - their SDE runs on every one of the 10 steps and the loss on the first 9
#     (`train.timestep_fraction = 0.99`: int(10 * 0.99) = 9); here the window is those 9 steps and
#     step 10 is the exact ODE step (it is not trained in either);
#   - bf16 instead of their fp16 (`config.mixed_precision = "fp16"`, base.py); no EMA of the LoRA
#     (`train.ema = True`); their T5 reads 128 tokens (train_sd3.py `max_sequence_length=128`), the
#     rollout 256 (vLLM-Omni's default).
# The authors' 1-GPU variant (`general_ocr_sd3_1gpu`): 8 prompts x 8 images per step
# (data.train_batch_size=8 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=32
# actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8: the 9 below does not divide 32). Full fine-tuning of it
# (actor_rollout_ref.model.lora.rank=0) ran on one 80 GB H100 at 115 s per step (docs/perf.md).
#
# Needs: a diffusers SD3.5 directory (MODEL_PATH, e.g. stabilityai/stable-diffusion-3.5-medium), the
# OCR prompt set (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an
# OpenAI-compatible VLM server for the OCR reward. Extra arguments are Hydra overrides (last wins).
# See docs/guide/models.md and docs/guide/training.md.
# Advantage settings and the SDE step are the algorithm's (config/algorithm/<name>.yaml; flow_grpo's defaults,
# global std, clip 5 and the `sde` step, are the ones above):
# not repeated here, so that `algorithm=<name>` (docs/guide/algorithms.md, "Launchers") brings another algorithm's keys.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Stable Diffusion 3.5 directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}
OCR_URL=${OCR_URL:-http://127.0.0.1:8000/v1}
OCR_MODEL=${OCR_MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
NGPUS=${NGPUS:-8}
NNODES=${NNODES:-1}
OUT=${OUT:-outputs/flowgrpo/sd3_ocr_lora}

# resolution 512 (grpo.py `config.resolution = 512`); 10 sampling steps (`sample.num_steps = 10`);
# CFG 4.5 (`sample.guidance_scale = 4.5`) with the empty negative prompt (train_sd3.py
# `compute_text_embeddings([""], ...)`); noise level 0.7 (base.py `sample.noise_level = 0.7`), the
# `sde` step; SDE window: the first 9 of 10 steps (`train.timestep_fraction = 0.99`); group size 24
# (`sample.num_image_per_prompt = 24`); 48 prompts per step (`48` in `num_batches_per_epoch`);
# two updates per step (gradient_accumulation_steps = num_batches_per_epoch // 2): mini-batch
# 48 * 24 / 2 = 576 samples; micro-batch 9 per GPU (`sample.train_batch_size = 9`, = train.batch_size);
# lr 3e-4, Adam weight decay 1e-4, grad-norm clip 1.0 (base.py `train.learning_rate`,
# `train.adam_weight_decay`, `train.max_grad_norm`); PPO clip range 1e-4 (base.py `train.clip_range`);
# KL beta 0.04 (grpo.py `train.beta = 0.04`); advantages clipped to 5 (base.py `train.adv_clip_max`),
# std over the whole batch (grpo.py `sample.global_std = True`); LoRA rank 32, alpha 64 (train_sd3.py
# `LoraConfig(r=32, lora_alpha=64)`) on the attention projections of both streams (its target_modules,
# the adapter's default); seed 42 (base.py `config.seed`); validation batch 16 (`sample.test_batch_size = 16`);
# checkpoint and validation every 60 steps (`save_freq = 60`, `eval_freq = 60`).
python3 -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.lora.rank=32 \
    actor_rollout_ref.model.lora.alpha=64 \
    actor_rollout_ref.rollout.height=512 \
    actor_rollout_ref.rollout.width=512 \
    actor_rollout_ref.rollout.num_inference_steps=10 \
    actor_rollout_ref.rollout.true_cfg_scale=4.5 \
    actor_rollout_ref.rollout.negative_prompt="" \
    actor_rollout_ref.rollout.noise_level=0.7 \
    actor_rollout_ref.rollout.sde_window_size=9 \
    actor_rollout_ref.rollout.sde_window_range='[0,9]' \
    actor_rollout_ref.rollout.n=24 \
    actor_rollout_ref.rollout.enable_batched_diffusion=True \
    actor_rollout_ref.rollout.dtype=bfloat16 \
    actor_rollout_ref.rollout.nnodes="$NNODES" \
    actor_rollout_ref.rollout.n_gpus_per_node="$NGPUS" \
    actor_rollout_ref.actor.ppo_mini_batch_size=576 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=9 \
    actor_rollout_ref.actor.clip_ratio=1e-4 \
    actor_rollout_ref.actor.kl_beta=0.04 \
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
    trainer.experiment_name=sd3_ocr_lora \
    trainer.default_local_dir="$OUT" \
    trainer.logger='["console","file","tensorboard"]' \
    trainer.save_freq=60 \
    trainer.test_freq=60 \
    "$@"
