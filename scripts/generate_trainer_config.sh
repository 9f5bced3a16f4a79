#!/usr/bin/env bash
# Rewrite what is generated from the config tree (run after changing any config node or config dataclass):
# verl_omni/trainer/config/_generated_flowgrpo_trainer.yaml (tests/trainer/test_flowgrpo_config.py checks it),
# docs/reference/config.md (tests/trainer/test_config_reference.py checks it), the scorer table
# docs/reference/scorers.md (tests/trainer/test_scorer_table.py checks it) and the model capability matrix
# docs/reference/models.md (tests/trainer/test_model_table.py checks it; run it too after changing a model adapter or
# verl_omni/trainer/config/model_evidence.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m verl_omni.trainer.config.generate
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m verl_omni.trainer.config.reference
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m verl_omni.trainer.config.scorer_table
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m verl_omni.trainer.config.model_table
