#!/usr/bin/env bash
# bf16 masters on the H200: the kernel tests under compute-sanitizer, the parity test against
# PyTorch's bf16 model, bench and memory (real and dry run) beside fp32 masters, and the loss
# curves (gpu_check.sh --masters). Run from the repository's root at 29bbf51 (device call 2).
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
mkdir -p "$OUT/logs"
"$B/tests/lmscope_gpu_tests" --gtest_filter='*Bf16Masters*:*RmsNorm*' >"$OUT/logs/gpu-tests.log" 2>&1
echo "== gpu tests (bf16 masters, rmsnorm) exit $?: $(tail -1 "$OUT/logs/gpu-tests.log")"
compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/lmscope_gpu_tests" --gtest_filter='*Bf16Masters*' \
  >"$OUT/logs/sanitizer.log" 2>&1
echo "== sanitizer exit $?: $(tail -1 "$OUT/logs/sanitizer.log")"; t
LMSCOPE="$B/lmscope" $PY tests/gpu/test_master_bf16_parity.py -v >"$OUT/parity.log" 2>&1
echo "== parity exit $?"; grep -E "ok$|FAIL|Error|Ran|losses|lmscope|largest" "$OUT/parity.log"; t
timeout 150 "$B/lmscope" bench --device cuda --model 2.7B --ctx 1024 --batch 4 --precision bf16 --master-dtype fp32,bf16 \
  --mode train --warmup 3 --steps 10 --format json --out "$OUT/bench-masters.json" >"$OUT/bench-masters.md" 2>&1
echo "== bench exit $?"; head -6 "$OUT/bench-masters.md"; t
for dry in "" "--dry-run"; do
  timeout 100 "$B/lmscope" memory --device cuda --model 2.7B --ctx 1024 --batch 4 --precision bf16 --master-dtype bf16 \
    $dry --format json --out "$OUT/logs/memory${dry:+-dry}.json" >/dev/null 2>&1
  echo "== memory $dry exit $?: $($PY -c "import json;r=json.load(open('$OUT/logs/memory${dry:+-dry}.json'))[0];print(r['status'],r['peak_bytes'],r['peak_reserved_bytes'])")"
done; t
OUT="$OUT/logs" LMSCOPE_BUILD_DIR=$B LMSCOPE_SKIP_GPU_TESTS=1 timeout 330 scripts/gpu_check.sh --masters 500 2>&1 | grep -v "^NVIDIA\|^name\|^20" ; t
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$OUT/logs"
