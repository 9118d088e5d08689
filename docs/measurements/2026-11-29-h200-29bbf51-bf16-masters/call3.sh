#!/usr/bin/env bash
# The 8B-leaderboard model's train step for one sequence at ctx 32768 on one H200 with bf16 masters
# (the recompute plan --recommend names, and two layers more in full), then --masters with seed 1.
# Device call 3: 29bbf51 with gpu_check.sh's SEED argument (committed in the next commit).
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
PY=/opt/torch/.venv/bin/python
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
start=$(date +%s)
t() { echo "   [$(( $(date +%s) - start )) s]"; }
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLMSCOPE_NCCL_ROOT=$NCCL -DLMSCOPE_PYTHON=$PY >"$OUT/build.log" 2>&1
cmake --build build-gpu -j 16 --target lmscope lmscope_gpu_tests >>"$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "== build"; t
B=build-gpu
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 230 "$B/lmscope" bench --device cuda --model 8B-leaderboard --ctx 32768 --batch 1 --precision bf16 \
  --master-dtype bf16 --recompute full:6+selective,full:8+selective --mode train --warmup 1 --steps 2 \
  --format json --out "$OUT/bench-8b-one-gpu.json" >"$OUT/bench-8b-one-gpu.md" 2>&1
echo "== bench 8B exit $?"; head -8 "$OUT/bench-8b-one-gpu.md"; t
mkdir -p "$OUT/logs"
OUT="$OUT/logs" LMSCOPE_BUILD_DIR=$B LMSCOPE_SKIP_GPU_TESTS=1 timeout 240 scripts/gpu_check.sh --masters 500 1 2>&1 | grep "^=="; t
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$OUT/logs"
