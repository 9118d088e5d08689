#!/usr/bin/env bash
# One H100: the train step, 26df609 (lmscope-26df609) against the working tree after it (lmscope:
# flash's delta kernel by 16-byte loads, a layer's head moves in one launch each), one process a
# cell, alternating, two rounds; then the new build's kernel profiles of small ctx 256, large and
# 2.7B ctx 1024.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
LMSCOPE_SKIP_GPU_TESTS=1 LMSCOPE_BUILD_DIR=$B timeout 400 scripts/gpu_check.sh --ab $B/lmscope-26df609 $B/lmscope \
  small@256,medium@512,large@1024,2.7B@1024 2 | tail -6
for cell in "small 256 5 20" "large 1024 3 10" "2.7B 1024 3 10"; do
  set -- $cell
  timeout 100 $B/lmscope bench --device cuda --model $1 --ctx $2 --precision bf16 --attention flash --batch 4 \
    --warmup $3 --steps $4 --profile --format json --out $OUT/profile-$1-$2.json > $OUT/profile-$1-$2.md 2>&1
  echo "profile $1 $2: $?"; grep -E "flash_delta|permute_heads" $OUT/profile-$1-$2.md | head -4
done
