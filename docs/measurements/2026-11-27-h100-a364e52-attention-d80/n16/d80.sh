#!/usr/bin/env bash
# One H100: Hopper flash-attention kernels at head dim 80 (the working tree) against a364e52
# (lmscope-a364e52, mma.sync at d 80): the flash GPU tests; the attention at the 2.7B step's shape;
# then 2.7B ctx 1024 and 256 train steps, one process a cell, base then new, two rounds.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 200 $B/tests/lmscope_gpu_tests --gtest_filter='FlashOnGpu.*:*Flash*' > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "FAILED|Failure|PASSED|SKIPPED \]|OK \]" $OUT/gpu-tests.log | head -30
grep -B2 -A8 'Failure' $OUT/gpu-tests.log | head -40
for b in lmscope-a364e52 lmscope; do
  timeout 120 $B/$b attention --device cuda --attention flash --precision bf16 --batch 128 --seq 1024 \
    --d 64,80,128 --deterministic --warmup 10 --iters 50 > $OUT/attention-$b.md 2>&1; echo "attention $b: $?"; tail -3 $OUT/attention-$b.md
done
cell() { timeout 120 $1 bench --device cuda --model $2 --ctx $3 --precision bf16 --attention flash --batch 4 \
  --warmup $4 --steps $5 $7 --format json --out $OUT/$6.json > $OUT/$6.md 2>&1; echo "$6: $?"; }
for round in 1 2; do
  for c in "2.7B 1024 3 10" "2.7B 256 3 10"; do
    set -- $c
    cell $B/lmscope-a364e52 $1 $2 $3 $4 base-$1-$2-$round
    cell $B/lmscope $1 $2 $3 $4 new-$1-$2-$round
  done
done
/usr/bin/env python3 - $OUT <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/*-*-*-*.json")):
    for r in json.load(open(f)):
        ms = r.get("ms") or {}
        print(os.path.basename(f)[:-5], tuple(round(ms[p]["median"], 3) for p in ("forward", "backward", "optimizer", "step")) if ms else r["status"])
PY
cd $OUT && tar czf d80.tgz base-* new-* attention-* && rm -f base-* new-*
