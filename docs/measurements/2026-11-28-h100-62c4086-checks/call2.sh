#!/usr/bin/env bash
# One H100: RMSNorm's dx kernel with dw's partial sums below 4096 rows (rows/4 blocks from 256, or
# rows/2: the build "lmscope-rows2") and the embedding's backward zeroing its own rows (no fill
# launch), against 62c4086: the GPU tests of both changes, compute-sanitizer over them, then one
# process a cell, the sides alternating, two rounds; kernel profiles of the new builds.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
export PATH=/usr/local/cuda/bin:$PATH
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 150 $B/tests/lmscope_gpu_tests --gtest_filter='*RmsNorm*:*Embedding*:*Graph*:*Model*:*Memory*' \
  > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "^\[ +(FAILED|PASSED) " $OUT/gpu-tests.log | head -8
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/lmscope_gpu_tests \
  --gtest_filter='CudaVsCpu.RmsNorm*:CudaVsCpu.Embedding:*/LowpVsCpu.RmsNorm*' > $OUT/sanitizer.log 2>&1
echo "sanitizer: $? ($(grep -c 'OK \]' $OUT/sanitizer.log) tests ok): $(tail -1 $OUT/sanitizer.log)"
cells=small@128,small@256,medium@512,2.7B@256
for v in rows4:lmscope rows2:lmscope-rows2; do
  mkdir -p $OUT/${v%:*}
  OUT=$OUT/${v%:*} LMSCOPE_SKIP_GPU_TESTS=1 LMSCOPE_BUILD_DIR=$B timeout 250 scripts/gpu_check.sh --ab \
    $B/lmscope-62c4086 $B/${v#*:} $cells 2 | tail -6
done
for v in lmscope lmscope-rows2; do
  for cell in small:256 medium:512; do
    m=${cell%:*}; c=${cell#*:}
    timeout 60 $B/$v bench --device cuda --model $m --ctx $c --precision bf16 --attention flash --batch 4 \
      --warmup 5 --steps 20 --profile --format json --out $OUT/profile-$v-$m-$c.json > $OUT/profile-$v-$m-$c.md 2>&1
    echo "profile $v $m $c: $?"
  done
done
