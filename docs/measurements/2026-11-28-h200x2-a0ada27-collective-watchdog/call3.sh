#!/usr/bin/env bash
# Call 3: this tree's lmscope; through NCCL on two GPUs, a hung rank by hand (what each rank says, in
# 50 s at most), whether two uninterrupted runs of the fault tests' training give the same bits (with
# --comm-sms auto, whose matrix products are chosen by timing them, and with --comm-sms 0), and then
# the rank-fault tests.
set -uo pipefail
cd "$(dirname "$0")/../../.."
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLMSCOPE_NCCL_ROOT="$NCCL" >"$OUT/configure.log" 2>&1 && cmake --build build-gpu -j 32 --target lmscope >"$OUT/build.log" 2>&1
echo "== build: exit $? at $(date -u +%T)"
mkdir -p build-gpu/tests && touch build-gpu/tests/lmscope_gpu_tests && chmod +x build-gpu/tests/lmscope_gpu_tests
export LMSCOPE_BUILD_DIR=build-gpu
source scripts/gpu_env.sh
export TMPDIR=$OUT/tmp; mkdir -p $TMPDIR
$PY -c "import numpy as np; np.random.default_rng(0).integers(0, 300, 20000, dtype=np.uint16).tofile('$OUT/tok.bin')"
T=(train --device cuda --d-model 64 --d-ff 128 --layers 2 --heads 2 --vocab 300 --ctx 16 --data "$OUT/tok.bin" --batch 2
  --sample sequential --steps 5 --ddp bucketed --bucket-mb 0.1)
start=$(date +%s.%N)
LMSCOPE_TEST_FAULT=1:3:hang:1 timeout -s KILL 50 "$B/lmscope" launch --nproc 2 -- "${T[@]}" --collective-timeout 3 >"$OUT/hang.out" 2>"$OUT/hang.err"
echo "== hung rank by hand: exit $? after $(echo "$(date +%s.%N) - $start" | bc) s"; cat "$OUT/hang.err"
for sms in auto 0; do
  for i in 1 2; do
    "$B/lmscope" launch --nproc 2 -- "${T[@]}" --comm-sms $sms --save "$OUT/w-$sms-$i.safetensors" >"$OUT/w-$sms-$i.log" 2>&1
  done
  cmp -s "$OUT/w-$sms-1.safetensors" "$OUT/w-$sms-2.safetensors" && echo "== --comm-sms $sms: two runs, the same bits" || echo "== --comm-sms $sms: two runs DIFFER"
done
LMSCOPE_DDP_PARTS=faults scripts/gpu_multi_check.sh 2>&1 | grep -v "^index\|H200\|^20"
grep -B2 -A12 "^FAIL\|^ERROR" "$OUT/rank-faults.log" | cut -c1-400 | head -60
