#!/usr/bin/env bash
# One H100: kernel profiles of large and 2.7B ctx 1024 before (lmscope-base, 4b243ef) and with the dx
# kernel that also sums dw's terms; bf16, flash, batch 4, fusion and graphs on.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
for m in large 2.7B; do
  for v in base new; do
    bin=$B/lmscope; [ $v = base ] && bin=$B/lmscope-base
    timeout 150 $bin bench --device cuda --model $m --ctx 1024 --precision bf16 --attention flash --batch 4 \
      --warmup 3 --steps 10 --profile --format json --out $OUT/profile-$m-1024-$v.json > $OUT/profile-$m-1024-$v.md 2>&1
    echo "$m $v: $?"; grep -E "RMSNorm|rmsnorm" $OUT/profile-$m-1024-$v.md | head -8
  done
done
