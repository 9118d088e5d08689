#!/usr/bin/env bash
# One H100, the tree after 229ee35 with plan --recommend trying resident copies: resident against
# kept copies, one build, one process a cell, the sides alternating, two rounds; then plan
# --recommend --measure where transient copies, selective recompute and a split compete (xl ctx 4096).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
R=$OUT/call4; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt; date -u >> $R/gpu.txt
OUT=$R LMSCOPE_SKIP_GPU_TESTS=1 LMSCOPE_BUILD_DIR=$B LMSCOPE_AB_BASE_ARGS="--weight-copies kept" \
  LMSCOPE_AB_NEW_ARGS="--weight-copies resident" timeout 330 scripts/gpu_check.sh --ab \
  $B/lmscope $B/lmscope small@256,large@1024,2.7B@1024 2 | tail -5
[[ "${SKIP_RECOMMEND:-}" ]] || timeout 200 $B/lmscope plan --recommend --measure --precision bf16 --attention flash --model xl --ctx 4096 \
  --batch 4 --warmup 1 > $R/recommend-xl-4096.md 2> $R/recommend-xl-4096.err
echo "recommend: $?"; tail -1 $R/recommend-xl-4096.md | cut -c1-600
tar -C $OUT -czf $OUT/call4.tgz call4 && rm -r $R
