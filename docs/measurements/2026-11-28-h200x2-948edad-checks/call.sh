#!/usr/bin/env bash
# On two H200s: build the tree (Hopper only, for time), every GPU test (the op table, two backends on
# two GPUs, the graphs test through the run layer, the dry run against the GPU's record), then the
# data-parallel tests through NCCL on both GPUs in fp32.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLMSCOPE_NCCL_ROOT="$NCCL" >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j 32 --target lmscope lmscope_gpu_tests >"$OUT/build.log" 2>&1 ||
  { grep -E "error" -A5 "$OUT/build.log" | head -40; exit 1; }
echo "== build ok at $(date -u +%T)"
timeout 330 build-gpu/tests/lmscope_gpu_tests >"$OUT/gpu-tests.log" 2>&1
echo "== GPU tests exit $? at $(date -u +%T)"; tail -4 "$OUT/gpu-tests.log"
grep -E "^\[  FAILED" "$OUT/gpu-tests.log" | head -20
LMSCOPE=build-gpu/lmscope LMSCOPE_DDP_DEVICE=cuda LMSCOPE_DDP_PRECISION=fp32 timeout 120 \
  /opt/torch/.venv/bin/python tests/cli/test_ddp_cli.py -v >"$OUT/ddp-cuda-fp32.log" 2>&1
echo "== data-parallel tests on two GPUs, fp32: exit $?"; grep -E "ok$|skipped|FAIL|Error|Ran" "$OUT/ddp-cuda-fp32.log" | head -20
