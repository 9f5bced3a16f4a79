#!/usr/bin/env bash
# The project's GPU CI. On the GPU machine, from the repository root, after every bundle part was carried:
# install the stack and this checkout (setup_stack.sh) and run `pytest -m gpu` over every visible GPU.
# Usage: bash scripts/device/run_gpu_tests.sh BUNDLE_DIR [pytest args]
# Writes under $OUT (or /tmp/gpu_tests when OUT is unset): gpu_tests.log (the whole output), gpu_tests.xml
# (JUnit, each test's captured output included) and gpu_summary.md (one page: test, result, seconds and the
# figures each printed, made by gpu_summary.py; the docs' GPU results table is pasted from it).
# Tests that need several GPUs skip themselves below their count (torch.cuda.device_count()), so on a
# 2-GPU host they run and on one GPU the summary lists them as skipped with the reason.
# Tests run on GPU_TEST_WORKERS pytest-xdist workers (default 6, `--dist worksteal`): a trainer test is mostly
# one process starting Ray, an engine and the actor one after the other, so the host's cores and the GPUs' memory
# take several side by side (the tiny models use a few GB). GPU_TEST_WORKERS=0 runs them in one process.
# Exits with pytest's status, after the summary is written.
set -euo pipefail
bundle=${1:?bundle dir}; shift
eval "$(bash "$(dirname "$0")/setup_stack.sh" "$bundle")"
out=${OUT:-/tmp/gpu_tests}
mkdir -p "$out"
cards=$(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | awk '{$1=$1" x"; print}' | paste -sd ',')
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
echo "visible GPUs: $gpus ($cards)"
workers=${GPU_TEST_WORKERS:-6}
parallel=()
[ "$workers" -gt 0 ] && parallel=(-n "$workers" --dist worksteal)
set +e
python3 -m pytest tests -m gpu ${parallel[@]+"${parallel[@]}"} -p no:cacheprovider -v -o junit_logging=system-out --junitxml="$out/gpu_tests.xml" \
  "$@" 2>&1 | tee "$out/gpu_tests.log"
status=${PIPESTATUS[0]}
set -e
python3 "$(dirname "$0")/gpu_summary.py" "$out/gpu_tests.xml" \
  --header "# GPU suite: $gpus GPU(s), $cards" \
  --header "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)" \
  > "$out/gpu_summary.md"
cat "$out/gpu_summary.md"
exit "$status"
