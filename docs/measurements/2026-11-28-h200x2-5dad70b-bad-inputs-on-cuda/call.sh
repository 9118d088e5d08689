#!/usr/bin/env bash
# Call C (a fresh machine, after the bad-input fixes were merged): this tree's lmscope for Hopper, then
# on CUDA the checkpoint files' tests, the training-run tests (fp32, bf16, fp16), the data-parallel
# tests through NCCL on both GPUs, and one cell each of bench, attention and the dry run.
set -uo pipefail
cd "$(dirname "$0")/../../.."
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLMSCOPE_NCCL_ROOT="$NCCL" >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j 32 --target lmscope >"$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -40; exit 1; }
mkdir -p build-gpu/tests && touch build-gpu/tests/lmscope_gpu_tests && chmod +x build-gpu/tests/lmscope_gpu_tests  # (not run here)
echo "== build ok at $(date -u +%T)"
export LMSCOPE_BUILD_DIR=build-gpu LMSCOPE_SKIP_GPU_TESTS=1
source scripts/gpu_env.sh
LMSCOPE="$B/lmscope" LMSCOPE_TRAIN_DEVICE=cuda timeout 120 $PY tests/cli/test_train_files_cli.py >"$OUT/train-files-cuda.log" 2>&1
echo "== test_train_files_cli on cuda: exit $?"; tail -1 "$OUT/train-files-cuda.log"
scripts/gpu_check.sh --training
LMSCOPE="$B/lmscope" LMSCOPE_DDP_DEVICE=cuda LMSCOPE_DDP_PRECISION=fp32 timeout 200 $PY tests/cli/test_ddp_cli.py -v >"$OUT/ddp-cuda-fp32.log" 2>&1
echo "== data-parallel tests on two GPUs, fp32: exit $? at $(date -u +%T)"; grep -E "ok$|skipped|FAIL|Error|Ran" "$OUT/ddp-cuda-fp32.log" | head -20
"$B/lmscope" bench --device cuda --model small --ctx 256 --precision bf16 --warmup 3 --steps 10 2>&1 | tail -4
"$B/lmscope" attention --batch 16 --heads 1 --seq 16384 --d 64 --precision bf16 --attention flash 2>&1 | tail -3
"$B/lmscope" memory --dry-run --device cuda --model 2.7B --ctx 1024 --precision bf16 --mode train 2>&1 | tail -2
