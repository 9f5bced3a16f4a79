#!/usr/bin/env bash
# Flow-GRPO on Qwen-Image with a LoRA, OCR reward (the known-good recipe): 512x512, 10 steps,
# true CFG 4, SDE window of 2 steps in [0, 5], noise level 1.2, LoRA r64, 16 samples per prompt.
#
# Needs: a diffusers Qwen-Image directory (MODEL_PATH), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM
# server for the OCR reward (e.g. `vllm serve Qwen/Qwen2.5-VL-7B-Instruct --port 8000`).
# The rollout replicas sit on the actor's GPUs (trainer.colocate_rollout=true) and offload their
# weights while the actor trains: one 141 GB GPU (NGPUS=1, an H200) holds both (docs/perf.md). One
# 80 GB GPU (an H100) holds them only with the actor's parameters and optimizer on the host between phases, and
# the host needs ~150 GB free (measured peak 145.6 GB; a 128 GB host ran out); step 2 of a 4-prompt run took
# 233 s (0.28 img/GPU/s with the adapter served, before model.lora.merge below;
# benchmarks/results/qwen_image_recipe.md "On one 80 GB H100"):
#   bash examples/flowgrpo_trainer/run_qwen_image_ocr_lora.sh actor_rollout_ref.actor.engine.param_offload=true \
#       actor_rollout_ref.actor.engine.optimizer_offload=true
# more GPUs: NGPUS actor ranks and as many rollout replicas. The actor's frozen base is bf16, its
# LoRA fp32; its transformer blocks are compiled (model.compile_transformer_blocks) and its forward-only
# phases run 16 samples per forward; each sync sends the rollout the adapted linears with the LoRA merged in
# (model.lora.merge: the rollout runs plain linears, as serving the r64 adapter costs the compiled rollout 1.21x),
# colocated on CUDA by CUDA IPC: one steady step on an H200 took 189 s (0.68 img/GPU/s; 202 s with the adapter
# served, 212 s sent through the host, 258 s also without compiled blocks and forward micro-batch 16; docs/perf.md).
# Extra arguments are Hydra overrides. See docs/guide/training.md.
#
# Not on here (off by default until its reward effect is shown neutral, docs/guide/rollout.md "Thinning the
# ODE after the window range"): steps 5..9, after every sample's window, as 3 DPM-Solver++ steps
# (8 of 10 transformer calls per image, the rollout 1.24x faster at full size on an H200; the window steps
# and their log-probs unchanged); to turn it on:
#   bash examples/flowgrpo_trainer/run_qwen_image_ocr_lora.sh actor_rollout_ref.rollout.ode_solver=dpmsolver++ \
#       actor_rollout_ref.rollout.ode_post_window_ratio=0.7
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-$HOME/models/Qwen-Image}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}
OCR_URL=${OCR_URL:-http://127.0.0.1:8000/v1}
OCR_MODEL=${OCR_MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
NGPUS=${NGPUS:-1}
NNODES=${NNODES:-1}
OUT=${OUT:-outputs/flowgrpo/qwen_image_ocr_lora}

python3 -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.lora.rank=64 \
    actor_rollout_ref.model.lora.alpha=128 \
    actor_rollout_ref.model.lora.merge=true \
    actor_rollout_ref.model.compile_transformer_blocks=true \
    actor_rollout_ref.rollout.height=512 \
    actor_rollout_ref.rollout.width=512 \
    actor_rollout_ref.rollout.num_inference_steps=10 \
    actor_rollout_ref.rollout.true_cfg_scale=4.0 \
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
    actor_rollout_ref.actor.infer_micro_batch_size_per_gpu=16 \
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
    'reward.diffusion.scorers=[{type: ocr, weight: 1.0, params: {url: '"$OCR_URL"', model: '"$OCR_MODEL"'}}]' \
    reward.diffusion.num_workers=1 \
    trainer.device=cuda \
    trainer.nnodes="$NNODES" \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.colocate_rollout=true \
    trainer.experiment_name=qwen_image_ocr_lora \
    trainer.default_local_dir="$OUT" \
    trainer.logger='["console","file","tensorboard"]' \
    trainer.total_training_steps=300 \
    trainer.save_freq=25 \
    trainer.test_freq=25 \
    trainer.val_grid_images=16 \
    "$@"
