#!/usr/bin/env bash
# One H100, the tree of 62c4086: the two GPU tests added after the last call of
# 2026-11-28-h100-747083c-rmsnorm-row-batched-gemms, compute-sanitizer memcheck over the final heads
# kernel (and the graph and flash tests), then kernel profiles of small ctx 256 and medium ctx 512.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
export PATH=/usr/local/cuda/bin:$PATH
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 120 $B/tests/lmscope_gpu_tests \
  --gtest_filter='CudaVsCpu.HeadsMovedTogetherGiveTheBitsOfEachAlone:GraphsOnGpu.FusedBf16StepsGiveTheUnfusedBits' \
  > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "^\[ +(OK|FAILED|PASSED) " $OUT/gpu-tests.log | head -8
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/lmscope_gpu_tests \
  --gtest_filter='*Heads*:FlashOnGpu.SixteenBit*:*Graph*' > $OUT/sanitizer.log 2>&1
echo "sanitizer: $? ($(grep -c 'OK \]' $OUT/sanitizer.log) tests ok): $(tail -1 $OUT/sanitizer.log)"
for cell in small:256 medium:512; do
  m=${cell%:*}; c=${cell#*:}
  timeout 60 $B/lmscope bench --device cuda --model $m --ctx $c --precision bf16 --attention flash --batch 4 \
    --warmup 5 --steps 20 --profile --format json --out $OUT/profile-$m-$c.json > $OUT/profile-$m-$c.md 2>&1
  echo "profile $m $c: $?"
done
