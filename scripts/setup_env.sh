#!/usr/bin/env bash
# Create .venv/ (if needed) and install verl_omni with its pinned stack (pyproject.toml).
# Idempotent: re-installs only when pyproject.toml changed since the last successful install.
# uv is used because it resolves and downloads the ~280 packages in parallel (about a minute
# here instead of many); it also ignores PIP_FIND_LINKS, so torch comes from PyPI (the CUDA
# build), which vLLM-Omni's imports need even on a CPU-only machine.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
stamp=.venv/.verl_omni-install-stamp
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup_env] installing verl_omni and its stack into .venv/ (first time: ~2 min, ~9 GB)" >&2
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q "uv>=0.9"
.venv/bin/uv pip install -q --python .venv/bin/python -e ".[test,rewards]"
echo "$want" >"$stamp"
echo "[setup_env] done" >&2
