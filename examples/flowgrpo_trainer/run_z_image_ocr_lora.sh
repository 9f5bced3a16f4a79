#!/usr/bin/env bash
# Flow-GRPO on Z-Image with a LoRA, OCR reward.
#
# The Flow-GRPO authors publish no Z-Image recipe (github.com/yifan123/flow_grpo at 54809b5 has
# configs for SD3.5, FLUX.1, Wan2.1, Qwen-Image and BAGEL). This launcher takes their recipe for
# the nearest model, Qwen-Image (config/grpo.py `pickscore_qwenimage`: also a single-stream-text
# DiT conditioned on an LLM's hidden states, 512², few steps, classic-scale CFG), which
# run_qwen_image_ocr_lora.sh uses too; each line says which number comes from where. Not tuned for
# Z-Image: treat it as a starting point.
# Where this trainer differs from that config: validation samples with the training steps (10; the
# authors evaluate Qwen-Image with `sample.eval_num_steps = 50`); OCR reward instead of PickScore.
# Z-Image's own guidance g is the classic scale minus one: true_cfg_scale=4 here is Z-Image's
# guidance_scale=3 (docs/guide/models.md); its schedule ends with a sigma = 0 step, so SDE windows must end by
# step num_inference_steps - 1 (the window range [0, 5] below does).
#
# Needs: a diffusers Z-Image directory (MODEL_PATH, ZImagePipeline layout), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM
# server for the OCR reward. Extra arguments are Hydra overrides (last wins). See docs/guide/models.md.
# Advantage settings and the SDE step are the algorithm's (config/algorithm/<name>.yaml; flow_grpo's defaults,
# global std, clip 5 and the `sde` step, are the ones above):
# not repeated here, so that `algorithm=<name>` (docs/guide/algorithms.md, "Launchers") brings another algorithm's keys.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Z-Image directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}
OCR_URL=${OCR_URL:-http://127.0.0.1:8000/v1}
OCR_MODEL=${OCR_MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
NGPUS=${NGPUS:-8}
NNODES=${NNODES:-1}
OUT=${OUT:-outputs/flowgrpo/z_image_ocr_lora}

# from `pickscore_qwenimage`: resolution 512 (`config.resolution = 512`); 10 steps
# (`sample.num_steps = 10`); CFG 4 (`sample.guidance_scale = 4`); noise level 1.2
# (`sample.noise_level = 1.2`), the `sde` step; an SDE window of 2 steps starting in the first half
# (`sample.sde_window_size = 2`, `sample.sde_window_range = (0, num_steps // 2)`); group size 16
# (`sample.num_image_per_prompt = 16`); 32 prompts per step (`32` in `num_batches_per_epoch`); two
# updates per step: mini-batch 32 * 16 / 2 = 256 samples; micro-batch 4 per GPU
# (`sample.train_batch_size = 4`); no KL (`train.beta = 0`); std over the whole batch
# (`sample.global_std = True`); bf16 (`config.mixed_precision = "bf16"`); checkpoint and validation
# every 30 steps (validation batch 16 here; theirs 4 per GPU). From config/base.py: lr 3e-4, Adam
# weight decay 1e-4, grad-norm clip 1.0, PPO clip
# range 1e-4, advantages clipped to 5, seed 42. LoRA rank 64, alpha 128: the authors' FLUX LoRA
# (scripts/train_flux.py `LoraConfig(r=64, lora_alpha=128)`) and run_qwen_image_ocr_lora.sh's.
python3 -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.lora.rank=64 \
    actor_rollout_ref.model.lora.alpha=128 \
    actor_rollout_ref.rollout.height=512 \
    actor_rollout_ref.rollout.width=512 \
    actor_rollout_ref.rollout.num_inference_steps=10 \
    actor_rollout_ref.rollout.true_cfg_scale=4.0 \
    actor_rollout_ref.rollout.negative_prompt="" \
    actor_rollout_ref.rollout.noise_level=1.2 \
    actor_rollout_ref.rollout.sde_window_size=2 \
    actor_rollout_ref.rollout.sde_window_range='[0,5]' \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.rollout.enable_batched_diffusion=True \
    actor_rollout_ref.rollout.dtype=bfloat16 \
    actor_rollout_ref.rollout.nnodes="$NNODES" \
    actor_rollout_ref.rollout.n_gpus_per_node="$NGPUS" \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.clip_ratio=1e-4 \
    actor_rollout_ref.actor.kl_beta=0.0 \
    actor_rollout_ref.actor.optim.lr=3e-4 \
    actor_rollout_ref.actor.optim.weight_decay=1e-4 \
    actor_rollout_ref.actor.optim.clip_grad=1.0 \
    actor_rollout_ref.actor.engine.seed=42 \
    actor_rollout_ref.actor.engine.model_dtype=bf16 \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=32 \
    data.val_batch_size=16 \
    'reward.diffusion.scorers=[{type: ocr, weight: 1.0, params: {url: '"$OCR_URL"', model: '"$OCR_MODEL"'}}]' \
    trainer.device=cuda \
    trainer.nnodes="$NNODES" \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.colocate_rollout=true \
    trainer.experiment_name=z_image_ocr_lora \
    trainer.default_local_dir="$OUT" \
    trainer.logger='["console","file","tensorboard"]' \
    trainer.save_freq=30 \
    trainer.test_freq=30 \
    "$@"
