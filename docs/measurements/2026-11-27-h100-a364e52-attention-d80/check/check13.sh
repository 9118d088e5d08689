#!/usr/bin/env bash
# One H100, the working tree with Hopper attention at d 80: every GPU test (the stored H100 facts
# print the live ones); the kernel profile of 2.7B ctx 1024 (bf16, flash, batch 4).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 420 $B/tests/lmscope_gpu_tests > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "FAILED|PASSED|SKIPPED \]|tests from.*ran" $OUT/gpu-tests.log | head -20
grep -A12 'StoredH100FactsAreThisH100s' $OUT/gpu-tests.log | head -30
timeout 100 $B/lmscope bench --device cuda --model 2.7B --ctx 1024 --precision bf16 --attention flash --batch 4 \
  --warmup 3 --steps 10 --profile --format json --out $OUT/profile-2.7B-1024.json > $OUT/profile-2.7B-1024.md 2>&1
echo "profile: $?"; grep -E 'attention|flash' $OUT/profile-2.7B-1024.md | head -8
