#!/usr/bin/env bash
# Flow-GRPO on Wan2.2 TI2V-5B text-to-video with a LoRA, OCR reward on every frame.
#
# A starting point, not a tuned recipe: the Flow-GRPO authors publish no Wan2.2 recipe, and nothing here
# has trained the released weights (the GPU machines cannot download them). Each number says where it
# comes from. The reward is the OCR scorer applied to every frame, a video's reward the mean over its
# frames (docs/guide/models.md, "Video models (Wan2.2)"); a served video reward model is the reward issue's
# (video scorers).
# Memory (H100 80 GB, random weights, benchmarks/results/models_gpu.md "Wan2.2"): gradient checkpointing is on
# by default; the actor's replay at 832x480x33 peaks at 12.1 GB (micro-batch 1) / 14.1 GB (2), and the rollout
# decodes 2 videos per VAE call so a group of 8 fits. The colocated trainer itself was not run on a GPU.
#
# Needs: a diffusers Wan2.2 TI2V-5B directory (MODEL_PATH, WanPipeline layout, e.g.
# Wan-AI/Wan2.2-TI2V-5B-Diffusers), the OCR prompt set (python examples/data_process/ocr_prompts.py
# --out "$DATA_DIR") and an OpenAI-compatible VLM server for the OCR reward. Extra arguments are Hydra
# overrides (last wins). Advantage settings and the SDE step are the algorithm's
# (config/algorithm/<name>.yaml): not repeated here, so that `algorithm=<name>` brings another algorithm's keys.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Wan2.2 TI2V-5B directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}
OCR_URL=${OCR_URL:-http://127.0.0.1:8000/v1}
OCR_MODEL=${OCR_MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
NGPUS=${NGPUS:-8}
NNODES=${NNODES:-1}
OUT=${OUT:-outputs/flowgrpo/wan2_2_5b_ocr_lora}

# 480x832: Wan's 480p size, both sides multiples of the 5B's 32 pixels (16 per latent cell x 2x2 patches);
# 33 frames (4k + 1, 9 latent frames): Pref-GRPO's Wan2.1 LoRA script (`--t 33`); 20 steps: ours, for
# cost (the released pipeline samples with 50; the schedule is vLLM-Omni's Euler with the checkpoint's
# flow_shift 5.0); CFG 5 with the empty negative prompt: the released TI2V-5B example's guidance_scale;
# noise level 0.7 and an SDE window of 2 steps in the first half: Flow-GRPO's defaults
# (`sample.noise_level`, `sample.sde_window_size`, `sample.sde_window_range = (0, num_steps // 2)`);
# group size 8: Pref-GRPO's Wan2.1 `--num_generations 8`; 16 prompts per step, two updates per step
# (mini-batch 64 samples), micro-batch 1 per GPU (video sequences are long); LoRA rank 64, alpha 128:
# Pref-GRPO's Wan2.1 LoRA; lr 3e-4, weight decay 1e-4, grad-norm clip 1.0, PPO clip 1e-4, no KL:
# Flow-GRPO's config/base.py and run_qwen_image_ocr_lora.sh; bf16 rollout and actor.
python3 -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.lora.rank=64 \
    actor_rollout_ref.model.lora.alpha=128 \
    actor_rollout_ref.rollout.height=480 \
    actor_rollout_ref.rollout.width=832 \
    actor_rollout_ref.rollout.num_frames=33 \
    actor_rollout_ref.rollout.num_inference_steps=20 \
    actor_rollout_ref.rollout.true_cfg_scale=5.0 \
    actor_rollout_ref.rollout.negative_prompt="" \
    actor_rollout_ref.rollout.noise_level=0.7 \
    actor_rollout_ref.rollout.sde_window_size=2 \
    actor_rollout_ref.rollout.sde_window_range='[0,10]' \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.enable_batched_diffusion=True \
    actor_rollout_ref.rollout.dtype=bfloat16 \
    actor_rollout_ref.rollout.nnodes="$NNODES" \
    actor_rollout_ref.rollout.n_gpus_per_node="$NGPUS" \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
    actor_rollout_ref.actor.clip_ratio=1e-4 \
    actor_rollout_ref.actor.kl_beta=0.0 \
    actor_rollout_ref.actor.optim.lr=3e-4 \
    actor_rollout_ref.actor.optim.weight_decay=1e-4 \
    actor_rollout_ref.actor.optim.clip_grad=1.0 \
    actor_rollout_ref.actor.engine.seed=42 \
    actor_rollout_ref.actor.engine.model_dtype=bf16 \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=16 \
    data.val_batch_size=16 \
    'reward.diffusion.scorers=[{type: ocr, weight: 1.0, params: {url: '"$OCR_URL"', model: '"$OCR_MODEL"'}}]' \
    trainer.device=cuda \
    trainer.nnodes="$NNODES" \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.colocate_rollout=true \
    trainer.experiment_name=wan2_2_5b_ocr_lora \
    trainer.default_local_dir="$OUT" \
    trainer.logger='["console","file","tensorboard"]' \
    trainer.save_freq=30 \
    trainer.test_freq=30 \
    "$@"
