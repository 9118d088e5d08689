#!/usr/bin/env bash
# Two GPUs: the add's tests; then xl and 2.7B at ctx 512 and 1024, bf16, flash, batch 4 a rank, bf16
# gradients: one GPU, bucketed 25 MB all-gather, all-reduce, all-gather, one GPU; a kernel profile of
# 2.7B ctx 512 with the all-gather.
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpus.txt; date -u >> $OUT/gpus.txt
CUDA_VISIBLE_DEVICES=0 $B/tests/lmscope_gpu_tests --gtest_filter='*Add*:*KernelTracer*:*FusedResidual*:*RmsNormForwardSame*' 2>&1 | grep -E "OK \]|FAILED|Failure|PASSED" | head
cell=(--device cuda --model xl,2.7B --ctx 512,1024 --precision bf16 --attention flash --warmup 3 --steps 10 --grad-dtype bf16 --format json)
one() { $B/lmscope bench "${cell[@]}" --batch 4 --graphs off --out $OUT/one-$1.json > $OUT/one-$1.md 2>&1; echo "one $1: $?"; }
two() { $B/lmscope launch --nproc 2 -- bench "${cell[@]}" --batch 8 --ddp bucketed --bucket-mb 25 --grad-exchange $2 --out $OUT/$2-$1.json > $OUT/$2-$1.md 2>&1; echo "$2 $1: $?"; }
one 1; two 1 all-gather; two 1 all-reduce; two 2 all-gather; one 2
$B/lmscope launch --nproc 2 -- bench --device cuda --model 2.7B --ctx 512 --precision bf16 --attention flash --warmup 3 --steps 5 --grad-dtype bf16 --batch 8 --ddp bucketed --grad-exchange all-gather --profile > $OUT/profile-all-gather.md 2>&1; echo "profile: $?"
/opt/torch/.venv/bin/python - $OUT <<'PY'
import json, sys, glob, os
out = sys.argv[1]
t = {}
for f in sorted(glob.glob(out + "/*.json")):
    for r in json.load(open(f)):
        k = (r["model"]["name"], r["ctx"])
        ms = r.get("ms") or {}
        t.setdefault(k, {})[os.path.basename(f)[:-5]] = tuple(round(ms[p]["median"], 2) for p in ("forward", "backward", "optimizer", "step")) if ms else r["status"]
for k, v in t.items():
    one = min(x[3] for n, x in v.items() if n.startswith("one"))
    print(k, {n: (x, round(x[3] / one, 3)) for n, x in v.items()})
PY
grep -A14 "exposed" $OUT/all-gather-1.md | head -8
cd $OUT && tar czf all.tgz *.json *.md && rm -f *.json *.md
