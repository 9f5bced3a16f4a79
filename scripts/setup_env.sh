#!/usr/bin/env bash
# Create .venv/ (if needed) and install verl_omni with its pinned stack (pyproject.toml).
# Idempotent: re-installs only when pyproject.toml or this script changed since the last successful install.
# uv is used because it resolves and downloads the ~280 packages in parallel (about a minute
# here instead of many); it also ignores PIP_FIND_LINKS, so torch comes from PyPI (the CUDA
# build), which vLLM-Omni's imports need even on a CPU-only machine.
# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (this workplace's
# shells) none is ever written, so every process would compile torch, verl, vLLM and diffusers from source:
# `import verl` took 13.5 s instead of 6.6 s, and a trainer run starts ~8 processes that import it
# (docs/development.md, "Keeping the suite fast").
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
stamp=.venv/.verl_omni-install-stamp
want=$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup_env] installing verl_omni and its stack into .venv/ (first time: ~2 min, ~9 GB)" >&2
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q "uv>=0.9"
.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -e ".[test,rewards]"
echo "$want" >"$stamp"
echo "[setup_env] done" >&2
