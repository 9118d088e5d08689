#!/usr/bin/env bash
# Build lmscope and the extension only (sm_90a), then the host costs of attention from PyTorch and the
# planner's ladder on the H200, its choice timed.
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
PY=/opt/torch/.venv/bin/python
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DLMSCOPE_NCCL_ROOT="$NCCL" \
  -DLMSCOPE_PYTHON="$PY" >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j 16 --target lmscope _lmscope lmscope_python_files >"$OUT/build.log" 2>&1 || { grep error -A5 "$OUT/build.log" | head -40; exit 1; }
echo "== built"; date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
LMSCOPE_BUILD_DIR=build-gpu scripts/install_python.sh "$PY" >"$OUT/install.log" 2>&1; echo "== install: exit $?"
LMSCOPE="$PWD/build-gpu/lmscope" timeout 60 $PY -m pytest -q -p no:cacheprovider tests/package/test_walkthrough.py 2>&1 | tail -3
timeout 120 $PY diag/host_backward.py 2>&1 | tee "$OUT/host-backward.txt"
timeout 240 build-gpu/lmscope plan --recommend --measure --model 2.7B --ctx 16384 --batch 1 --precision bf16 \
  --attention flash --warmup 1 --measure-steps 3 --format md >"$OUT/recommend-2.7B-16384.md" 2>"$OUT/recommend.log"
echo "== plan --recommend --measure: exit $?"; cat "$OUT/recommend-2.7B-16384.md"; tail -3 "$OUT/recommend.log"
