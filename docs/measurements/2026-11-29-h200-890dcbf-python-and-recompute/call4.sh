#!/usr/bin/env bash
# The package's tests on the GPU and attention's speed through PyTorch, at HEAD (sm_90a build).
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
PY=/opt/torch/.venv/bin/python
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DLMSCOPE_NCCL_ROOT="$NCCL" \
  -DLMSCOPE_PYTHON="$PY" >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j 16 --target lmscope _lmscope lmscope_python_files >"$OUT/build.log" 2>&1 || { grep error -A5 "$OUT/build.log" | head -40; exit 1; }
echo "== built $(git log --oneline -1 | cut -c1-7)"; date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
LMSCOPE_BUILD_DIR=build-gpu scripts/install_python.sh "$PY" >"$OUT/install.log" 2>&1; echo "== install: exit $?"
LMSCOPE="$PWD/build-gpu/lmscope" timeout 120 $PY -m pytest -q -p no:cacheprovider tests/package >"$OUT/package-tests.log" 2>&1
echo "== package tests: exit $?"; tail -3 "$OUT/package-tests.log"
timeout 200 $PY tools/attention_through_pytorch.py --lmscope build-gpu/lmscope --out "$OUT/att.json" >"$OUT/att.md" 2>"$OUT/att.log"
echo "== attention through PyTorch: exit $?"; cat "$OUT/att.md"
