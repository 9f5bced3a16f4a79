#!/usr/bin/env bash
# Flow-GRPO on Wan2.2 T2V-A14B (two experts) text-to-video with a LoRA on both experts, OCR reward on every frame:
# the preset verl_omni/trainer/config/experiment/wan2_2_a14b_ocr_lora.yaml (the 5B recipe with the A14B's CFG; a
# starting point, not a tuned recipe), with the paths below. How the two experts train (one LoRA over both, each
# recorded step replayed by the expert that sampled it, two diffusers LoRA files per checkpoint): docs/guide/models.md,
# "Video models (Wan2.2)".
# Memory: each expert is a 14 B transformer (28 GB of bf16 weights), and the rollout keeps both resident, so a
# colocated replica needs ~56 GB for the experts alone before the actor's FSDP shards and activations: plan on
# 141 GB GPUs (H200) or a separate rollout pool. Not run end to end on a GPU (benchmarks/results/models_gpu.md, "Wan2.2 T2V-A14B").
#
# Needs: a diffusers Wan2.2 T2V-A14B directory (MODEL_PATH, WanPipeline layout with transformer_2 and boundary_ratio
# in model_index.json, e.g. Wan-AI/Wan2.2-T2V-A14B-Diffusers), the OCR prompt set
# (python examples/data_process/ocr_prompts.py --out "$DATA_DIR") and an OpenAI-compatible VLM server for the OCR
# reward at OCR_URL serving OCR_MODEL. NGPUS (default 8), NNODES and OUT size and place the run. Extra arguments are
# Hydra overrides (last wins); `algorithm=<name>` brings another algorithm's keys.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a diffusers Wan2.2 T2V-A14B directory}
DATA_DIR=${DATA_DIR:-$HOME/data/ocr}

source "$(dirname "$0")/recipe.sh"
run_recipe wan2_2_a14b_ocr_lora OCR "$@"
