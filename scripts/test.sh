#!/usr/bin/env bash
# Install (if needed) and run the CPU test suite. Extra arguments go to pytest (a later `-n 0` runs it in
# one process, `-n 4` on four workers).
# GPU tests (marked `gpu`) are deselected here; scripts/device/ runs them on a GPU machine.
# Two workers, one test file each at a time (`--dist loadfile`: a module's shared engine or trainer run
# stays in one process), taken in the order tests/conftest.py gives (longest first; xdist's own order is
# by test count): a trainer run or an engine start is mostly one process importing, so the second core
# would otherwise wait (docs/development.md, "Keeping the suite fast").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# the project's own modules as bytecode too (setup_env.sh compiles the installed stack): with
# PYTHONDONTWRITEBYTECODE set no process would write them, and every Ray worker imports verl_omni
.venv/bin/python -m compileall -q verl_omni benchmarks >/dev/null
set +e
.venv/bin/python -m pytest tests -m "not gpu" -n 2 --dist loadfile --no-loadscope-reorder "$@"
rc=$?
set -e
# pytest exits 5 when nothing was collected: that is a broken suite, say so.
if [ "$rc" -eq 5 ]; then
  echo "[test] pytest collected no tests" >&2
fi
exit "$rc"
