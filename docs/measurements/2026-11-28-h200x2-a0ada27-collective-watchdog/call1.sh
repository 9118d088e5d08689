#!/usr/bin/env bash
# Each call builds this tree's lmscope for Hopper, and with `ab` 36e8c25's (ab-base/, untracked, from
# `git archive 36e8c25 src tests scripts tools CMakeLists.txt`) beside it. Call 1 (no argument), through
# NCCL on the two GPUs: the rank-fault tests (scripts/gpu_multi_check.sh's faults part) and the
# data-parallel tests (fp32). Call 2 (`ab`): the A/B of the data-parallel train step (call2.sh).
set -uo pipefail
cd "$(dirname "$0")/../../.."
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
build() {  # SOURCE DIR TARGETS...
  local src=$1 dir=$2; shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DLMSCOPE_NCCL_ROOT="$NCCL" >"$OUT/configure-$(basename "$dir").log" 2>&1 &&
    cmake --build "$dir" -j 16 --target "$@" >"$OUT/build-$(basename "$dir").log" 2>&1
}
build . build-gpu lmscope & new=$!
[[ ${1:-} == ab ]] && { build ab-base /root/base-build lmscope & base=$!; }
wait $new; echo "== this tree's build: exit $? at $(date -u +%T)"
[[ ${1:-} == ab ]] && { wait $base; echo "== 36e8c25's build: exit $? at $(date -u +%T)"; }
grep -E "error" -A5 "$OUT"/build-*.log | head -30
mkdir -p build-gpu/tests && touch build-gpu/tests/lmscope_gpu_tests && chmod +x build-gpu/tests/lmscope_gpu_tests  # (not run here)
[[ ${1:-} == ab ]] && exec bash "$(dirname "$0")/call2.sh"
export LMSCOPE_BUILD_DIR=build-gpu
source scripts/gpu_env.sh
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee "$OUT/gpus.txt"
LMSCOPE_DDP_PARTS=faults scripts/gpu_multi_check.sh 2>&1 | grep -v "^index\|H200\|^20"
LMSCOPE="$B/lmscope" LMSCOPE_DDP_DEVICE=cuda LMSCOPE_DDP_PRECISION=fp32 timeout 200 $PY tests/cli/test_ddp_cli.py -v >"$OUT/ddp-cuda-fp32.log" 2>&1
echo "== data-parallel tests on two GPUs, fp32: exit $? at $(date -u +%T)"; grep -E "ok$|skipped|FAIL|Error|Ran" "$OUT/ddp-cuda-fp32.log" | head -20
