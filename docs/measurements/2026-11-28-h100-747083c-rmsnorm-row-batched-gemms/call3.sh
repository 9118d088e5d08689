#!/usr/bin/env bash
# One H100: the train step, cd03237 (lmscope-base) against the working tree after 747083c (lmscope:
# the RMSNorm backward's row function shared, and dx written in bf16 by the same pass), one process a
# cell, alternating, two rounds (gpu_check.sh --ab); then the new build's kernel profiles of small
# ctx 256 and large ctx 1024.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
LMSCOPE_SKIP_GPU_TESTS=1 LMSCOPE_BUILD_DIR=$B timeout 420 scripts/gpu_check.sh --ab $B/lmscope-base $B/lmscope \
  small@256,medium@512,large@1024,2.7B@1024 2 | tail -6
for cell in "small 256 5 20" "large 1024 3 10"; do
  set -- $cell
  timeout 90 $B/lmscope bench --device cuda --model $1 --ctx $2 --precision bf16 --attention flash --batch 4 \
    --warmup $3 --steps $4 --profile --format json --out $OUT/profile-$1-$2.json > $OUT/profile-$1-$2.md 2>&1
  echo "profile $1 $2: $?"; grep -E "rmsnorm|cast_kernel|elementwise" $OUT/profile-$1-$2.md | head -6
done
