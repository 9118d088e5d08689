#!/usr/bin/env bash
# One H100, 87d62bb's build: every GPU test; compute-sanitizer memcheck over the RMSNorm tests; the
# kernel profile of small ctx 256 (bf16, flash, batch 4, fusion and graphs on).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
export PATH=/usr/local/cuda/bin:$PATH
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 420 $B/tests/lmscope_gpu_tests > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "FAILED|Failure|PASSED|SKIPPED \]|tests from.*ran" $OUT/gpu-tests.log | head -20
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/lmscope_gpu_tests --gtest_filter='*RmsNorm*' > $OUT/sanitizer.log 2>&1
echo "sanitizer: $?"; tail -3 $OUT/sanitizer.log
timeout 60 $B/lmscope bench --device cuda --model small --ctx 256 --precision bf16 --attention flash --batch 4 \
  --warmup 5 --steps 20 --profile --format json --out $OUT/profile-small-256.json > $OUT/profile-small-256.md 2>&1
echo "profile: $?"; head -40 $OUT/profile-small-256.md
