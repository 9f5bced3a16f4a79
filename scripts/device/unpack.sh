#!/usr/bin/env bash
# On the GPU machine: collect the bundle parts carried so far (kept in /tmp/gpu-parts between
# calls while the machine stays warm); without --collect-only, also install everything into
# /tmp/site (once) and print the PYTHONPATH export to eval.
# Usage: bash unpack.sh BUNDLE_DIR [--collect-only]
set -euo pipefail
src=${1:?bundle dir}
mkdir -p /tmp/gpu-parts
cp "$src"/part-*.d/part-* /tmp/gpu-parts/ 2>/dev/null || true
if [ "${2:-}" = "--collect-only" ]; then
  ls /tmp/gpu-parts >&2
  exit 0
fi
if [ ! -f /tmp/site/.done ]; then
  mkdir -p /tmp/site /tmp/gpu-unpack
  cat /tmp/gpu-parts/part-* | gunzip -c | tar -C /tmp/gpu-unpack -xf -
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/gpu-unpack/wheels/*.whl >&2
  tar -C /tmp/site -xf /tmp/gpu-unpack/vllm.tar
  touch /tmp/site/.done
fi
echo "export PYTHONPATH=/tmp/site:\${PYTHONPATH:-}"
