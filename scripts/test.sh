#!/usr/bin/env bash
# Install (if needed) and run the CPU test suite. Extra arguments go to pytest.
# GPU tests (marked `gpu`) are deselected here; scripts/device/ runs them on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
set +e
.venv/bin/python -m pytest tests -m "not gpu" "$@"
rc=$?
set -e
# pytest exits 5 when nothing was collected: that is a broken suite, say so.
if [ "$rc" -eq 5 ]; then
  echo "[test] pytest collected no tests" >&2
fi
exit "$rc"
