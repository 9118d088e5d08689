#!/usr/bin/env bash
# One H100: the cross-entropy kernels with 16-byte loads against 87d62bb's (lmscope-87d62bb): GPU tests,
# then the train step one process a cell, base then new, two rounds (bf16, flash, batch 4, fusion and
# graphs on), and each build's kernel profile of small ctx 256 and large ctx 1024.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
timeout 200 $B/tests/lmscope_gpu_tests --gtest_filter='CudaVsCpu.*:*LowpVsCpu*:*Graph*:*Bench*:*Train*' > $OUT/gpu-tests.log 2>&1
echo "tests: $?"; grep -E "FAILED|Failure|PASSED|SKIPPED \]" $OUT/gpu-tests.log | head -20
cell() { timeout 120 $1 bench --device cuda --model $2 --ctx $3 --precision bf16 --attention flash --batch 4 \
  --warmup $4 --steps $5 $7 --format json --out $OUT/$6.json > $OUT/$6.md 2>&1; echo "$6: $?"; }
for round in 1 2; do
  for c in "small 256 5 20" "large 1024 3 10"; do
    set -- $c
    cell $B/lmscope-87d62bb $1 $2 $3 $4 base-$1-$2-$round
    cell $B/lmscope $1 $2 $3 $4 new-$1-$2-$round
  done
done
for c in "small 256 5 20" "large 1024 3 10"; do
  set -- $c
  cell $B/lmscope-87d62bb $1 $2 $3 $4 profile-base-$1-$2 --profile
  cell $B/lmscope $1 $2 $3 $4 profile-new-$1-$2 --profile
  grep -h cross_entropy $OUT/profile-*-$1-$2.md
done
/usr/bin/env python3 - $OUT <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/*-*-*-*.json")):
    if "profile" in f: continue
    for r in json.load(open(f)):
        ms = r.get("ms") or {}
        print(os.path.basename(f)[:-5], tuple(round(ms[p]["median"], 3) for p in ("forward", "backward", "optimizer", "step")) if ms else r["status"])
    for k in (json.load(open(f))[0].get("kernels") or {}).get("kernels", []):
        pass
PY
python3 - $OUT <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/profile-*.json")):
    r = json.load(open(f))[0]
    for k in r["kernels"]["kernels"]:
        if "cross_entropy" in k["name"] or "loss_sum" in k["name"]:
            print(os.path.basename(f)[:-5], k["name"], round(k["ms"] * 1000 / k["calls"], 2), "us a call")
PY
cd $OUT && tar czf ce.tgz base-* new-* profile-* && rm -f base-* new-* profile-*
