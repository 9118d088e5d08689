#!/usr/bin/env bash
# One device call: build, the package's checks and attention's speed through PyTorch, the GPU tests of
# recomputation per layer, and the ladder's time and memory at 2.7B ctx 16384.
export OUT
LMSCOPE_SKIP_GPU_TESTS=1 timeout 420 scripts/gpu_check.sh --python 2>&1 | grep -v "^(16" | tail -16
source scripts/gpu_env.sh >/dev/null 2>&1 </dev/null || true
B=build-gpu
timeout 200 $B/tests/lmscope_gpu_tests --gtest_filter='MemoryDietOnGpu.Recomputation*:MemoryOnGpu.DryRunRecordsEvery*' >"$OUT/gpu-tests-recompute.log" 2>&1
echo "== GPU tests of recomputation: exit $?"; grep -E "within|OK \]|FAILED|PASSED|Failure" "$OUT/gpu-tests-recompute.log" | head -30
timeout 150 $B/lmscope bench --device cuda --model 2.7B --ctx 16384 --batch 1 --precision bf16 --attention flash \
  --recompute selective,full:8+selective,full:16+selective,full:24+selective,full --warmup 2 --steps 5 --format md \
  >"$OUT/ladder-bench.md" 2>"$OUT/ladder-bench.log"
echo "== bench over the ladder: exit $?"; grep -E "^\|" "$OUT/ladder-bench.md" | head -12; tail -2 "$OUT/ladder-bench.log"
