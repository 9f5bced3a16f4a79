#!/usr/bin/env bash
# Build, here (CPU, PyPI reachable), the bundle that carries verl_omni's stack to a GPU machine
# that has torch 2.11 + CUDA but no internet, split into parts small enough for one transfer each.
# Usage: bash scripts/device/prepare_bundle.sh [OUT_DIR=.gpu-bundle]
# Then carry OUT_DIR/part-NN.d, one per call, running `bash OUT_DIR/part-NN.d/unpack.sh OUT_DIR --collect-only`;
# in the last call: `eval "$(bash OUT_DIR/part-NN.d/unpack.sh OUT_DIR)"` and your command
# (scripts/device/run_gpu_tests.sh does that for the GPU tests). OUT_DIR must be git-ignored.
set -euo pipefail
# pip warns once per package about unreachable local index mirrors configured on this machine
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-.gpu-bundle}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels" "$out"
rm -rf "$out"/part-*
platforms=()
for n in 39 35 34 31 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
grep -v '^#' "$here/requirements-device.txt" | sed '/^$/d' >"$work/req.txt"
echo "[prepare_bundle] downloading $(wc -l <"$work/req.txt") packages for Python 3.12" >&2
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$work/wheels" -r "$work/req.txt"
# omegaconf/hydra need antlr4 4.9.x, published only as a source distribution.
python3 -m pip wheel -q --no-deps -w "$work/wheels" "antlr4-python3-runtime==4.9.3"
# vLLM: keep its Python code, its third_party Python modules (the bundled pynvml is how it detects
# CUDA), the core op library and the FA3 extension; drop LLM-only kernels (FA2, MoE, Rust tool).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$work" "vllm==0.26.0"
mkdir -p "$work/v" && (cd "$work/v" && unzip -q "$work"/vllm-0.26.0-*.whl)
(cd "$work/v" && rm -rf vllm/_moe_C* vllm/vllm-rs vllm/_flashmla_C* vllm/_qutlass_C* vllm/vllm_flash_attn/_vllm_fa2_C* &&
  find vllm/third_party -type f ! -name '*.py' -delete)
tar -C "$work/v" -cf "$work/vllm.tar" vllm vllm-0.26.0.dist-info
tar -C "$work" -cf "$work/bundle.tar" wheels vllm.tar
gzip -1 -c "$work/bundle.tar" | split -b 50m -d - "$out/part-"
for p in "$out"/part-??; do
  mkdir -p "$p.d" && mv "$p" "$p.d/" && cp "$here/unpack.sh" "$p.d/"
done
du -sh "$out"/part-*.d >&2
