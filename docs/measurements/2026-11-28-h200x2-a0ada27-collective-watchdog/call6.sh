#!/usr/bin/env bash
# Call 6 (one H200: no two-GPU machine was lent): this tree's lmscope for Hopper; the training-run
# tests on CUDA (checkpoints, a run killed and resumed bit for bit, SIGTERM and SIGHUP saving the step,
# now with every command's signal handling), and one GPU's resume after a stop at step 2 (resume4.sh's
# one-GPU case).
set -uo pipefail
cd "$(dirname "$0")/../../.."
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLMSCOPE_NCCL_ROOT="$NCCL" >/tmp/configure.log 2>&1 && cmake --build build-gpu -j 16 --target lmscope >/tmp/build.log 2>&1
echo "== build: exit $? at $(date -u +%T)"; grep -E "error" -A3 /tmp/build.log | head
for prec in fp32 bf16; do
  LMSCOPE=build-gpu/lmscope LMSCOPE_TRAIN_DEVICE=cuda LMSCOPE_TRAIN_PRECISION=$prec timeout 150 \
    /opt/torch/.venv/bin/python tests/cli/test_train_cli.py >"$OUT/train-cli-cuda-$prec.log" 2>&1
  echo "== training-run tests on CUDA, $prec: exit $? at $(date -u +%T)"; tail -3 "$OUT/train-cli-cuda-$prec.log"
done
RESUME_CASES="one%GPU" bash "$(dirname "$0")/resume4.sh"
