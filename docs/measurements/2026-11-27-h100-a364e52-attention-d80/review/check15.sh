#!/usr/bin/env bash
# One H100, the tree after review: the RMSNorm (the widest rows that take the partials among them),
# cross-entropy, Hopper flash (d 80 with the n80 products, n16 gone), graph and memory GPU tests; the
# 2.7B ctx 1024 step once.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 400 $B/tests/lmscope_gpu_tests --gtest_filter='*RmsNorm*:*CrossEntropy*:FlashOnGpu.*:*Graph*:MemoryOnGpu.StoredH100FactsAreThisH100s' > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "FAILED|PASSED|SKIPPED \]|OK \]" $OUT/gpu-tests.log | head -30
timeout 100 $B/lmscope bench --device cuda --model 2.7B --ctx 1024 --precision bf16 --attention flash --batch 4 \
  --warmup 3 --steps 10 > $OUT/step-2.7B-1024.md 2>&1; echo "step: $?"; grep '^| 2.7B' $OUT/step-2.7B-1024.md
