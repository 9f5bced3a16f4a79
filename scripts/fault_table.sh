#!/usr/bin/env bash
# The fault-injection suite (tests/faults/) over the given seeds, one trial at a time; prints the fault table
# (docs/guide/reliability.md, "Fault injection") when it ends. Each trial is two tiny trainer runs on CPU.
#   bash scripts/fault_table.sh            # seeds 0 1 2
#   bash scripts/fault_table.sh "0"        # one seed
# Extra arguments go to pytest, e.g. -k "actor" for one fault.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${1:-0 1 2}"
shift || true
FAULT_SEEDS="$seeds" exec bash scripts/test.sh -m faults -n 0 -s tests/faults "$@"
