#!/usr/bin/env bash
# Configures and builds lmscope into build/ (CUDA too when nvcc is found; LMSCOPE_CUDA=OFF to skip).
set -euo pipefail
cd "$(dirname "$0")/.."

# nvcc lives outside PATH on a default CUDA install.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cuda_flag=()
if [[ -n "${LMSCOPE_CUDA:-}" ]]; then cuda_flag=("-DLMSCOPE_CUDA=${LMSCOPE_CUDA}"); fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_flag[@]}" >/dev/null
cmake --build build
