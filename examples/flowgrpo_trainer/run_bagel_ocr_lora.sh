#!/usr/bin/env bash
# Flow-GRPO LoRA training of BAGEL (thinker + DiT) on OCR prompts, vLLM-Omni rollout.
#
# python -m verl_omni.trainer.main_flowgrpo with BAGEL's keys; see docs/guide/models.md ("BAGEL", "Training run").
#   BAGEL_PATH=/models/BAGEL-7B-MoT DATA_DIR=~/data/ocr bash examples/flowgrpo_trainer/run_bagel_ocr_lora.sh [overrides...]
# The prompt set: python examples/data_process/ocr_prompts.py --out "$DATA_DIR"; the OCR reward: an
# OpenAI-compatible VLM server at OCR_URL serving OCR_MODEL (as the other OCR launchers).
# DEPLOY selects vLLM-Omni's BAGEL topology: bagel (thinker + DiT, default) or bagel_single_stage (DiT only).
# BAGEL's rollout computes in bf16: the actor recomputes log pi_old (use_rollout_log_probs=true is refused).
# The CPU test tests/trainer/test_bagel_flowgrpo_e2e.py sets the same keys on the tiny BAGEL.
set -euo pipefail

BAGEL_PATH=${BAGEL_PATH:?set BAGEL_PATH to a BAGEL checkpoint directory (ByteDance-Seed/BAGEL-7B-MoT layout)}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}
OCR_URL=${OCR_URL:-http://127.0.0.1:8000/v1}
OCR_MODEL=${OCR_MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
DEPLOY=${DEPLOY:-bagel}
NGPUS=${NGPUS:-8}
DEPLOY_CONFIG=$(python -c "from verl_omni.pipelines.bagel import vllm_omni_deploy_config as p; print(p('$DEPLOY'))")

python -m verl_omni.trainer.main_flowgrpo \
    actor_rollout_ref.model.path="$BAGEL_PATH" \
    actor_rollout_ref.model.lora.rank=64 \
    actor_rollout_ref.model.lora.alpha=128 \
    actor_rollout_ref.actor.optim.lr=3e-4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.engine.model_dtype=bf16 \
    actor_rollout_ref.actor.use_rollout_log_probs=false \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.height=512 \
    actor_rollout_ref.rollout.width=512 \
    actor_rollout_ref.rollout.num_inference_steps=15 \
    actor_rollout_ref.rollout.true_cfg_scale=4.0 \
    actor_rollout_ref.rollout.negative_prompt="" \
    actor_rollout_ref.rollout.noise_level=0.7 \
    actor_rollout_ref.rollout.sde_window_size=2 \
    +actor_rollout_ref.rollout.model_kwargs.timestep_shift=3.0 \
    "+actor_rollout_ref.rollout.model_kwargs.cfg_interval=[0.4,1.0]" \
    +actor_rollout_ref.rollout.engine_kwargs.vllm_omni.deploy_config="$DEPLOY_CONFIG" \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=32 \
    'reward.diffusion.scorers=[{type: ocr, weight: 1.0, params: {url: '"$OCR_URL"', model: '"$OCR_MODEL"'}}]' \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.experiment_name=bagel_ocr_lora \
    "$@"
