#!/usr/bin/env bash
# Call 1: build this tree (build-gpu, every target: the layer checks among them) and e46b528's
# (ab-base/, lmscope only, into /root/base-build) side by side, then every GPU test on this tree's build.
set -uo pipefail
cd "$(dirname "$0")/../../.."
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
(cmake -S ab-base -B /root/base-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
   -DLMSCOPE_NCCL_ROOT="$NCCL" >/tmp/base-configure.log 2>&1 &&
 cmake --build /root/base-build -j 10 --target lmscope >/tmp/base-build.log 2>&1; echo "== base build exit $? at $(date -u +%T)") &
export LMSCOPE_SKIP_GPU_TESTS=1
source scripts/gpu_env.sh   # builds build-gpu
echo "== build-gpu at $(date -u +%T): $(ls build-gpu/lmscope_layer_check_* | wc -l) layer checks linked"
wait
timeout 330 "$B/tests/lmscope_gpu_tests" >"$OUT/gpu-tests.log" 2>&1
echo "== GPU tests exit $? at $(date -u +%T)"; tail -3 "$OUT/gpu-tests.log"; grep -E "^\[  FAILED" "$OUT/gpu-tests.log" | head -20
ls -la /root/base-build/lmscope build-gpu/lmscope
