#!/usr/bin/env bash
# One H100: the GPU tests of the RMSNorm backward, the dry run's records and device graphs; then the
# train step before (lmscope-base, 4b243ef) and with the dx kernel that also sums dw's terms, one
# process a cell, alternating, two rounds; bf16, flash, batch 4, fusion and graphs on (the defaults).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 300 $B/tests/lmscope_gpu_tests --gtest_filter='CudaVsCpu.*:*LowpVsCpu*:MemoryOnGpu.*:*Graph*' > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "FAILED|Failure|PASSED|SKIPPED \]" $OUT/gpu-tests.log | head -20
cell() { timeout 120 $1 bench --device cuda --model $2 --ctx $3 --precision bf16 --attention flash --batch 4 \
  --warmup $4 --steps $5 --format json --out $OUT/$6.json > $OUT/$6.md 2>&1; echo "$6: $?"; }
for round in 1 2; do
  for c in "small 256 5 20" "large 1024 3 10" "2.7B 1024 3 10"; do
    set -- $c
    cell $B/lmscope-base $1 $2 $3 $4 base-$1-$2-$round
    cell $B/lmscope $1 $2 $3 $4 new-$1-$2-$round
  done
done
/usr/bin/env python3 - $OUT <<'PY'
import json, sys, glob, os
t = {}
for f in sorted(glob.glob(sys.argv[1] + "/*-*-*-*.json")):
    name = os.path.basename(f)[:-5]
    for r in json.load(open(f)):
        ms = r.get("ms") or {}
        t[name] = tuple(round(ms[p]["median"], 3) for p in ("forward", "backward", "optimizer", "step")) if ms else r["status"]
for k, v in t.items(): print(k, v)
PY
cd $OUT && tar czf ab.tgz *.json *.md && rm -f *.json base-*.md new-*.md
