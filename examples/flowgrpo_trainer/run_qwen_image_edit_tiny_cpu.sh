#!/usr/bin/env bash
# Flow-GRPO on the tiny random Qwen-Image-Edit, on the CPU: instruction + source image per prompt
# (verl_omni/trainer/config/experiment/qwen_image_edit_tiny_cpu.yaml). The tiny model and the tiny editing set are
# built once under outputs/builtin/. Extra arguments are Hydra overrides. See docs/guide/models.md.
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

python3 -m verl_omni.trainer.main_flowgrpo +experiment=qwen_image_edit_tiny_cpu \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    trainer.default_local_dir="$OUT" \
    "$@"
