#!/usr/bin/env bash
# One H100: the RMSNorm, loss, flash and graph GPU tests of 747083c and compute-sanitizer over the
# RMSNorm, loss and flash ones; gemm_algorithms (first 4 algorithms) at small, medium, large and 2.7B's
# shapes with the batched rows; then the train step, cd03237 (lmscope-base) against 747083c (the RMSNorm
# row function), one process a cell, alternating, two rounds.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
export PATH=/usr/local/cuda/bin:$PATH
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 240 $B/tests/lmscope_gpu_tests --gtest_filter='*RmsNorm*:*CrossEntropy*:*Flash*:*Graph*:*Lowp*' > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "FAILED|Failure|PASSED|SKIPPED \]" $OUT/gpu-tests.log | head -20
for shape in "768 3072 1024" "1024 4096 2048" "1280 5120 4096" "2560 10240 4096"; do
  timeout 100 $B/gemm_algorithms $shape 10000 4 > "$OUT/gemm-${shape// /-}.md" 2>&1; echo "gemm $shape: $?"
done
LMSCOPE_SKIP_GPU_TESTS=1 LMSCOPE_BUILD_DIR=$B timeout 200 scripts/gpu_check.sh --ab $B/lmscope-base $B/lmscope \
  small@256,medium@512,large@1024 2 | tail -6
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/lmscope_gpu_tests \
  --gtest_filter='*RmsNorm*:*CrossEntropy*:FlashOnGpu.Hopper*:FlashOnGpu.SixteenBit*:FlashOnGpu.TheAssignments*' > $OUT/sanitizer.log 2>&1
echo "sanitizer: $? ($(grep -c 'OK \]' $OUT/sanitizer.log) tests ok): $(tail -1 $OUT/sanitizer.log)"
