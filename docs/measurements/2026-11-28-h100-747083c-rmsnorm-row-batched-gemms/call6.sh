#!/usr/bin/env bash
# One H100: call5 again with the heads kernel picking its move by constant indices (the moves'
# pointers were in each thread's local memory there): the heads and graph GPU tests, the train
# step, 26df609 against the working tree, two rounds; the new build's kernel profile of large ctx 1024.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 60 $B/tests/lmscope_gpu_tests --gtest_filter='*Heads*:*Graph*:*Rope*' > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "FAILED|PASSED" $OUT/gpu-tests.log | head -5
LMSCOPE_SKIP_GPU_TESTS=1 LMSCOPE_BUILD_DIR=$B timeout 300 scripts/gpu_check.sh --ab $B/lmscope-26df609 $B/lmscope \
  small@256,large@1024,2.7B@1024 2 | tail -5
timeout 60 $B/lmscope bench --device cuda --model large --ctx 1024 --precision bf16 --attention flash --batch 4 \
  --warmup 3 --steps 10 --profile --format json --out $OUT/profile-large-1024.json > $OUT/profile-large-1024.md 2>&1
echo "profile: $?"; grep -E "permute_heads" $OUT/profile-large-1024.md | head -4
