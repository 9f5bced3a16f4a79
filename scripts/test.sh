#!/usr/bin/env bash
# Install (if needed) and run the CPU test suite. Extra arguments go to pytest (a later `-n 0` runs it in
# one process, `-n 4` on four workers).
# The quick tier, for a developer after each change (no engine, Ray cluster, trainer run or fresh interpreter;
# a few minutes on two cores):
#   bash scripts/test.sh -m "not slow"
# GPU tests (marked `gpu`) are deselected here, also under a `-m` of your own (it is joined to `not gpu`);
# scripts/device/ runs them on a GPU machine.
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
# pytest keeps only the last `-m`: a caller's expression is joined to `not gpu` instead of replacing it. The
# fault-injection suite (marked `faults`, minutes per trial) runs only when an expression names it
# (scripts/fault_table.sh)
markers="not gpu and not faults"
args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -m)
      [ "$#" -ge 2 ] || { echo "[test] -m needs a marker expression, e.g. -m \"not slow\"" >&2; exit 4; }
      markers="($2) and not gpu"
      [[ "$2" == *faults* ]] || markers="$markers and not faults"
      shift 2
      ;;
    -m?*)
      markers="(${1#-m}) and not gpu"
      [[ "$1" == *faults* ]] || markers="$markers and not faults"
      shift
      ;;
    *)
      args+=("$1")
      shift
      ;;
  esac
done
set +e
.venv/bin/python -m pytest tests -m "$markers" -n 2 --dist loadfile --no-loadscope-reorder ${args[@]+"${args[@]}"}
rc=$?
set -e
# pytest exits 5 when nothing was collected: that is a broken suite, say so.
if [ "$rc" -eq 5 ]; then
  echo "[test] pytest collected no tests" >&2
fi
exit "$rc"
