#!/usr/bin/env bash
# Call 1 (one H200): cuBLASLt's workspace from the allocator (a segment apart, made at the first GEMM).
# Builds this tree's lmscope and GPU tests, and 4c963b6's lmscope (ab-base/: `git archive 4c963b6 src
# tests scripts tools CMakeLists.txt | tar -x -C ab-base`) for call 2; runs every GPU test
# (MemoryOnGpu holds the dry run to the GPU's record event for event, and to the driver).
set -uo pipefail
cd "$(dirname "$0")/../../.."
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
PY=/opt/torch/.venv/bin/python
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
build() {
  local src=$1 dir=$2; shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DLMSCOPE_NCCL_ROOT="$NCCL" >/tmp/configure-$(basename "$dir").log 2>&1 &&
    cmake --build "$dir" -j 16 --target "$@" >/tmp/build-$(basename "$dir").log 2>&1
}
build . build-gpu lmscope lmscope_gpu_tests & new=$!; build ab-base /root/base-build lmscope & base=$!
wait $new; echo "== this tree's build: exit $? at $(date -u +%T)"; grep -E "error" -A3 /tmp/build-build-gpu.log | head
wait $base; echo "== base build: exit $? at $(date -u +%T)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 330 build-gpu/tests/lmscope_gpu_tests >"$OUT/gpu-tests.log" 2>&1
echo "== GPU tests: exit $? at $(date -u +%T)"; tail -3 "$OUT/gpu-tests.log"; grep -E "^\[  FAILED" "$OUT/gpu-tests.log" | head
grep -E "MemoryOnGpu|cublaslt" "$OUT/gpu-tests.log" | grep -E "OK|FAILED" | head -20
