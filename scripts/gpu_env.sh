# Sourced by the scripts that run on the GPU machine (shared/GPU-MACHINE.md): its paths, $OUT, and
# the build. Sets OUT (default ./gpu-out), PY (PyTorch's Python) and B, the build directory: it builds
# build-gpu unless LMSCOPE_BUILD_DIR names binaries built elsewhere (DIR/lmscope,
# DIR/tests/lmscope_gpu_tests), and exits 1 when the build fails, 2 when DIR lacks them.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
PY=/opt/torch/.venv/bin/python
# NCCL ships inside PyTorch's wheel there (shared/GPU-MACHINE.md).
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
B=${LMSCOPE_BUILD_DIR:-build-gpu}
if [[ -z "${LMSCOPE_BUILD_DIR:-}" ]]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a;80" \
    -DLMSCOPE_NCCL_ROOT="$NCCL" -DLMSCOPE_PYTHON="$PY" >"$OUT/configure.log" 2>&1 \
    || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build build-gpu -j 16 >"$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
  echo "== build ok"
elif [[ ! -x "$B/lmscope" || ! -x "$B/tests/lmscope_gpu_tests" ]]; then
  echo "LMSCOPE_BUILD_DIR=$B lacks lmscope or tests/lmscope_gpu_tests: build there first, or leave it unset to build here."
  exit 2
fi
# Prebuilt binaries find the CUDA and CUPTI libraries here (a local build links them by rpath).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
