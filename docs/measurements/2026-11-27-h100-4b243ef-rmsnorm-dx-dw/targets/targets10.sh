#!/usr/bin/env bash
# One H100, 87d62bb's build: the issue's three named cells (bf16, flash, batch 4, fusion and graphs on)
# with kept copies (the default) and resident ones, one process a cell, two rounds.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
cell() { timeout 120 $B/lmscope bench --device cuda --model $1 --ctx $2 --precision bf16 --attention flash --batch 4 \
  --warmup $3 --steps $4 --weight-copies $5 --format json --out $OUT/$5-$1-$2-$6.json > $OUT/$5-$1-$2-$6.md 2>&1; echo "$5 $1 $2 $6: $?"; }
for round in 1 2; do
  for c in "small 256 5 20" "large 1024 3 10" "2.7B 1024 3 10"; do
    set -- $c
    cell $1 $2 $3 $4 kept $round
    cell $1 $2 $3 $4 resident $round
  done
done
/usr/bin/env python3 - $OUT <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    for r in json.load(open(f)):
        ms = r.get("ms") or {}
        print(os.path.basename(f)[:-5], tuple(round(ms[p]["median"], 3) for p in ("forward", "backward", "optimizer", "step")) if ms else r["status"], round(r.get("peak_bytes", 0) / 2**30, 2))
PY
cd $OUT && tar czf targets.tgz *.json *.md && rm -f kept-* resident-*
