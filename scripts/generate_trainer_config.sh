#!/usr/bin/env bash
# Rewrite what is generated from the config tree (run after changing any config node or config dataclass):
# verl_omni/trainer/config/_generated_flowgrpo_trainer.yaml (tests/trainer/test_flowgrpo_config.py checks it),
# docs/reference/config.md (tests/trainer/test_config_reference.py checks it) and the scorer table
# docs/reference/scorers.md (tests/trainer/test_scorer_table.py checks it).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m verl_omni.trainer.config.generate
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m verl_omni.trainer.config.reference
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m verl_omni.trainer.config.scorer_table
