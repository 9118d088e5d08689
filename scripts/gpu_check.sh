#!/usr/bin/env bash
# On the GPU machine (shared/GPU-MACHINE.md): build, run the GPU tests, compute-sanitizer over the
# op tests, then lmscope and the PyTorch reference on the same cells in the same run.
# Full logs go to $OUT (or ./gpu-out); a short table prints last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
PY=/opt/torch/.venv/bin/python
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
date -u +%FT%TZ | tee -a "$OUT/gpu.txt"

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a;80" >"$OUT/configure.log" 2>&1 \
  || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j 16 >"$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "== build ok"

(cd build-gpu && ctest -L gpu --output-on-failure) >"$OUT/gpu-tests.log" 2>&1
tail -5 "$OUT/gpu-tests.log"
grep -E "Failed|failed" -A15 "$OUT/gpu-tests.log" | head -60

compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/lmscope_gpu_tests \
  --gtest_filter='-*TwentyTraining*:*OutOfMemory*' >"$OUT/sanitizer.log" 2>&1
echo "== compute-sanitizer memcheck exit $? ($(grep -c 'OK \]' "$OUT/sanitizer.log") tests ok): $(tail -1 "$OUT/sanitizer.log")"

if [[ "${1:-}" == "--bench" ]]; then
  shift
  cells=("$@")
  for cell in "${cells[@]}"; do
    read -r model ctx prec <<<"$cell"
    build-gpu/lmscope bench --device cuda --model "$model" --ctx "$ctx" --batch 4 --precision "$prec" --mode train \
      --warmup 5 --steps 10 --format csv 2>/dev/null | tail -1 >>"$OUT/lmscope.csv"
    (cd pytorch && $PY bench_reference.py --device cuda --model "$model" --ctx "$ctx" --batch 4 --precision "$prec" \
      --warmup 5 --steps 10 | tail -1) >>"$OUT/pytorch.md"
  done
  echo "== lmscope (train step, ms)"
  cut -d, -f1,8,11,14,19,24,29,30,35,36,37 "$OUT/lmscope.csv"
  echo "== pytorch"
  cat "$OUT/pytorch.md"
fi
