#!/usr/bin/env bash
# Call 3 (one H200): the training-run and training-files tests on CUDA in fp32 and bf16 at the tree
# named in the README (train's log now opens with the run's description; the stop signals in one place).
set -uo pipefail
cd "$(dirname "$0")/../../.."
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
PY=/opt/torch/.venv/bin/python
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLMSCOPE_NCCL_ROOT="$NCCL" >/tmp/configure.log 2>&1 && cmake --build build-gpu -j 16 --target lmscope >/tmp/build.log 2>&1
echo "== build: exit $? at $(date -u +%T)"; grep -E "error" -A3 /tmp/build.log | head
for test in test_train_cli test_train_files_cli; do
  for prec in fp32 bf16; do
    LMSCOPE=build-gpu/lmscope LMSCOPE_TRAIN_DEVICE=cuda LMSCOPE_TRAIN_PRECISION=$prec timeout 200 \
      $PY tests/cli/$test.py >"$OUT/$test-cuda-$prec.log" 2>&1
    echo "== $test on CUDA, $prec: exit $? at $(date -u +%T): $(tail -1 "$OUT/$test-cuda-$prec.log")"
    grep -E "^(FAIL|ERROR):" "$OUT/$test-cuda-$prec.log" | head -5
  done
done
