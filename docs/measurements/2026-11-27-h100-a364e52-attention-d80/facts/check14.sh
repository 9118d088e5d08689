#!/usr/bin/env bash
# One H100, 4fe4740's build: the memory GPU tests (the stored H100 facts against the live ones, the dry
# run's records against the GPU's) and the flash and graph tests.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 400 $B/tests/lmscope_gpu_tests --gtest_filter='MemoryOnGpu.*:FlashOnGpu.HopperKernelsMatchTheDefinition:*Graph*:*CrossEntropy*:*RmsNorm*' > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "FAILED|PASSED|SKIPPED \]|OK \]" $OUT/gpu-tests.log | head -30
