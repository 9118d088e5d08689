#!/usr/bin/env bash
# One H100: the kept form (RMSNorm's dw partial sums from two rows a block, 2048 rows up; the
# embedding's backward zeroing its own rows) against 62c4086: its GPU tests, compute-sanitizer over
# them, then one process a cell, the sides alternating, two rounds. Everything packed into one file.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
export PATH=/usr/local/cuda/bin:$PATH
B=build-carry
R=$OUT/call3; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt; date -u >> $R/gpu.txt
timeout 150 $B/tests/lmscope_gpu_tests --gtest_filter='*RmsNorm*:*Embedding*:*Graph*:*Model*:*Memory*:*Bench*' \
  > $R/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "^\[ +(FAILED|PASSED) " $R/gpu-tests.log | head -8
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/lmscope_gpu_tests \
  --gtest_filter='CudaVsCpu.RmsNorm*:CudaVsCpu.Embedding:*/LowpVsCpu.RmsNorm*' > $R/sanitizer.log 2>&1
echo "sanitizer: $? ($(grep -c 'OK \]' $R/sanitizer.log) tests ok): $(tail -1 $R/sanitizer.log)"
OUT=$R LMSCOPE_SKIP_GPU_TESTS=1 LMSCOPE_BUILD_DIR=$B timeout 330 scripts/gpu_check.sh --ab \
  $B/lmscope-62c4086 $B/lmscope small@256,medium@512,large@512,2.7B@512 2 | tail -6
timeout 60 $B/lmscope bench --device cuda --model large --ctx 512 --precision bf16 --attention flash --batch 4 \
  --warmup 3 --steps 10 --profile --format json --out $R/profile-large-512.json > $R/profile-large-512.md 2>&1
echo "profile: $?"
tar -C $OUT -czf $OUT/call3.tgz call3 && rm -r $R
