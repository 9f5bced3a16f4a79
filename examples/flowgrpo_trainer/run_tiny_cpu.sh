#!/usr/bin/env bash
# The built-in CPU run on its preset (verl_omni/trainer/config/experiment/tiny_cpu.yaml): the tiny random Qwen-Image
# (built once under outputs/builtin/), the built-in prompts and the toy brightness reward; the defaults of
# flowgrpo_trainer.yaml, which `bash scripts/run.sh` runs, on the CPU. Extra arguments are Hydra overrides.
# See docs/guide/training.md.
set -euo pipefail

OUT=${OUT:-outputs/flowgrpo/flowgrpo_tiny}

python3 -m verl_omni.trainer.main_flowgrpo +experiment=tiny_cpu trainer.default_local_dir="$OUT" "$@"
