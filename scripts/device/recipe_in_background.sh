#!/usr/bin/env bash
# On the GPU machine, from the repository root, after `eval "$(bash scripts/device/setup_stack.sh .gpu-bundle)"`:
# the OCR recipe benchmark (benchmarks/flowgrpo_recipe_step.py, ~20 min on an H200 with the checkpoint's writing)
# outlasts one device call (10 min). It runs in its own session, which outlives the call, and each call waits for
# it up to WAIT seconds, then prints the steps so far. The next call must come within the machine's 30 s idle
# release, or the machine and the run are gone.
#   START=1 WAIT=500 bash scripts/device/recipe_in_background.sh [Hydra overrides]   # first call
#   WAIT=560 bash scripts/device/recipe_in_background.sh                              # each later call
# A later call needs no setup_stack.sh (it runs no Python). Keep WAIT plus the set-up's ~20 s under the call's
# limit: a call cut by its limit returns nothing of what it printed (the run itself goes on).
# WARMUP=K leaves the first K steps (the compile steps) out of the steady state (default 2: the actor compiles in step 1,
# the rollout again in step 2, its first engine batch of all the step's requests). A later step in which the actor
# compiled again (its first new text length, with model.compile_dynamic=false) is left out too. The Qwen-Image recipe
# compiles again in step 2 (inside the warm-up) and at the first π_old check after step 1 (the check's forward meets a
# new text length): with rollout_log_prob_check_freq=4, STEPS=4 leaves steps 3 and 4 steady; STEPS=5 adds the check
# step 5, left out as a compile step.
# RECIPE=sd3 runs the SD3.5 recipe instead (benchmarks/flowgrpo_recipe_step.py --recipe); GPUS=N runs it on N GPUs
# of the host (N actor ranks and N colocated replicas; set PROMPTS=8N for the one-GPU per-GPU load).
# OUT (the device tool's folder) receives the log and, at the end, the per-step JSON. The GPU's and the host's
# used memory are sampled every 2 s while the run lives (all processes: the actor and the colocated rollout);
# each call prints their peaks so far.
# Two runs side by side on a host of two GPUs (each its own Ray, one GPU each; the second reads the checkpoint the
# first writes, once it is written): TAG names a run's files, SHARE_MODEL_OF the run whose checkpoint to wait for.
#   CUDA_VISIBLE_DEVICES=0 START=1 TAG=a WAIT=5 bash scripts/device/recipe_in_background.sh [overrides of a]
#   CUDA_VISIBLE_DEVICES=1 START=1 TAG=b SHARE_MODEL_OF=a WAIT=500 bash scripts/device/recipe_in_background.sh [...]
#   TAG=a WAIT=540 bash scripts/device/recipe_in_background.sh; TAG=b WAIT=5 bash scripts/device/recipe_in_background.sh
# AFTER (a regular expression, default '^\[recipe\] wrote') is the line of the first run's log the second waits for:
# AFTER='^step:1 ' starts it once the first has compiled its step 1, so that it compiles from the inductor cache the
# first wrote on the host (a warm start, beside the first run's cold one).
set -uo pipefail
run=/tmp/recipe${TAG:+_$TAG}
log=$run.log
memlog=${run}_gpu_memory.csv
if [ -n "${START:-}" ]; then
  recipe=${RECIPE:-qwen_image}
  write=--write-model
  wait_for=""
  if [ -n "${SHARE_MODEL_OF:-}" ]; then
    write=""
    wait_for=/tmp/recipe_$SHARE_MODEL_OF.log
  fi
  # $0 of the inner shell: the log whose AFTER line this run waits for (none: start at once; nor once its run is gone)
  # $1 of the inner shell: the line to wait for
  setsid nohup bash -c 'until [ -z "$0" ] || grep -qsE "$1" "$0" || ! kill -0 "$(cat "${0%.log}.pid")" 2> /dev/null; do
    sleep 5; done; shift; exec "$@"' "$wait_for" "${AFTER:-^\[recipe\] wrote}" \
    python3 benchmarks/flowgrpo_recipe_step.py --recipe "$recipe" --model "/tmp/model_$recipe" $write \
    --prompts "${PROMPTS:-8}" --steps "${STEPS:-3}" --warmup-steps "${WARMUP:-2}" --gpus "${GPUS:-1}" \
    --out "$run" --json "$run.json" "$@" \
    > "$log" 2>&1 < /dev/null &
  echo $! > "$run.pid"
  rm -f "$memlog"
  setsid nohup bash -c "while kill -0 $(cat "$run.pid") 2> /dev/null; do
    echo \$(free -m | awk '/^Mem/ {print \$3}'),\$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | paste -sd,) >> $memlog
    sleep 2; done" > /dev/null 2>&1 < /dev/null &
  sleep 5
fi
end=$((SECONDS + ${WAIT:-540}))
while [ $SECONDS -lt $end ]; do
  if grep -q "trainer process:" "$log" || ! kill -0 "$(cat "$run.pid")" 2> /dev/null; then break; fi
  sleep 10
done
grep -E "^\[recipe\]|^step:[0-9]+ " "$log" | cut -c1-300 | tail -8
grep -E "Traceback|OutOfMemory|recompile_limit|killed" "$log" | tail -5 | cut -c1-300
free -g | head -2
nvidia-smi --query-gpu=memory.used --format=csv,noheader
# each sample: host MiB, then one column per GPU
awk -F, '{for (i = 1; i <= NF; i++) if ($i + 0 > peak[i]) peak[i] = $i + 0} END {
  printf "peak so far: host memory used %d MiB; GPU memory used (MiB):", peak[1]
  for (i = 2; i <= NF; i++) printf " %d", peak[i]; print ""}' "$memlog" 2> /dev/null
cp "$memlog" "${OUT:-/tmp}/" 2> /dev/null
tail -c 15000000 "$log" > "${OUT:-/tmp}/$(basename "$log")"
cp "$run.json" "${OUT:-/tmp}/" 2> /dev/null && grep '^{' "$log" | tail -4
exit 0
