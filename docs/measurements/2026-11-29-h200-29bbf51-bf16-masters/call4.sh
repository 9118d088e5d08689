#!/usr/bin/env bash
# Where the 8B-leaderboard step with bf16 masters and full:6+selective runs out of memory on the
# H200 (device call 4, the tree of call 3).
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
PY=/opt/torch/.venv/bin/python
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
start=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLMSCOPE_NCCL_ROOT=$NCCL -DLMSCOPE_PYTHON=$PY >"$OUT/build.log" 2>&1
cmake --build build-gpu -j 16 --target lmscope >>"$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "== build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader
timeout 200 build-gpu/lmscope memory --device cuda --model 8B-leaderboard --ctx 32768 --batch 1 --precision bf16 \
  --master-dtype bf16 --recompute full:6+selective --format json --out "$OUT/memory-8b-full6.json" >"$OUT/memory-8b-full6.md" 2>"$OUT/memory-8b-full6.err"
echo "== memory exit $?"; head -c 1500 "$OUT/memory-8b-full6.md"; cat "$OUT/memory-8b-full6.err" | tail -5
$PY -c "
import json; r=json.load(open('$OUT/memory-8b-full6.json'))[0]
print({k: r.get(k) for k in ('status','peak_bytes','peak_reserved_bytes','step_start_bytes','device_memory','peak_reached')})"
echo "== done $(( $(date +%s) - start )) s"
