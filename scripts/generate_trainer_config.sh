#!/usr/bin/env bash
# Rewrite verl_omni/trainer/config/_generated_flowgrpo_trainer.yaml from the YAML tree
# (run after changing any config node; tests/trainer/test_generated_config.py checks it).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m verl_omni.trainer.config.generate
