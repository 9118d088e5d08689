#!/usr/bin/env bash
# One H100: every GPU test of the working tree after 26df609 (flash's delta kernel by 16-byte loads;
# a layer's head moves in one launch each), then compute-sanitizer memcheck over the heads, flash
# and graph tests.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
export PATH=/usr/local/cuda/bin:$PATH
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 330 $B/tests/lmscope_gpu_tests > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "FAILED|Failure|PASSED|SKIPPED \]" $OUT/gpu-tests.log | head -20
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/lmscope_gpu_tests \
  --gtest_filter='*Heads*:FlashOnGpu.SixteenBit*:FlashOnGpu.TheAssignments*:FlashOnGpu.Fp32*:*Graph*' > $OUT/sanitizer.log 2>&1
echo "sanitizer: $? ($(grep -c 'OK \]' $OUT/sanitizer.log) tests ok): $(tail -1 $OUT/sanitizer.log)"
